// Package webhook embeds the resclass webhook's manifests, so that the e2e
// harness and the demo run the webhook with the configuration, RBAC and quota
// rule this directory ships.
package webhook

import _ "embed"

// Webhooks is webhooks.yaml: the ValidatingWebhookConfiguration.
//
//go:embed webhooks.yaml
var Webhooks []byte

// MutatingWebhooks is mutating-webhooks.yaml: the MutatingWebhookConfiguration
// that records a ResourceDistribution's author.
//
//go:embed mutating-webhooks.yaml
var MutatingWebhooks []byte

// RBAC is rbac.yaml: the webhook's ServiceAccount and its roles.
//
//go:embed rbac.yaml
var RBAC []byte

// CertRotatorRBAC is cert-rotator-rbac.yaml: the cert rotator's
// ServiceAccount and its roles.
//
//go:embed cert-rotator-rbac.yaml
var CertRotatorRBAC []byte

// CertRotatorPolicy is cert-rotator-policy.yaml: the admission policy that
// lets the cert rotator change the caBundle of the webhook configurations and
// nothing else of them.
//
//go:embed cert-rotator-policy.yaml
var CertRotatorPolicy []byte

// Secret is secret.yaml: the (empty) TLS Secret the cert rotator fills.
//
//go:embed secret.yaml
var Secret []byte

// QuotaConfig is policies/quota-config.yaml: the covering-quota ConfigMap of
// the kustomize component that turns the pod policies on.
//
//go:embed policies/quota-config.yaml
var QuotaConfig []byte

// PolicyWebhooks is policies/webhooks.yaml: the component's JSON patch of
// the ValidatingWebhookConfiguration, which adds the pods and workloads
// webhooks.
//
//go:embed policies/webhooks.yaml
var PolicyWebhooks []byte

// PolicyComponent is policies/kustomization.yaml: the component itself,
// whose Deployment patch adds the webhook's flags that go with the policies.
//
//go:embed policies/kustomization.yaml
var PolicyComponent []byte

// AuthorPolicy is author-policy.yaml: the admission policy that binds a
// ResourceDistribution's recorded author to the requester.
//
//go:embed author-policy.yaml
var AuthorPolicy []byte
