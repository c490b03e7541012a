package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/resclass/resclass/e2e/framework"
)

// The refusals of deploy/webhook/cert-rotator-policy.yaml.
const (
	rotatorOnlyCABundle = "the cert rotator may change a webhook's clientConfig.caBundle and nothing else"
	rotatorNoMetadata   = "the cert rotator may not change a webhook configuration's metadata"
	rotatorNoCreate     = "the cert rotator may only update the caBundle of the resclass webhook configurations, never create or delete one"
)

// TestCertRotatorMayChangeOnlyTheCABundle: the cert rotator's identity, whose
// RBAC grants update on the two webhook configurations whole, is refused by
// its admission policy on the real apiserver (dry runs, impersonated) every
// change that would hand it admission: another URL or Service, rules widened
// to Secrets, failurePolicy Ignore, an emptied selector, a webhook removed or
// reordered, metadata; and creating or deleting a configuration, or writing
// another one, even where RBAC would allow it. A caBundle change is
// admitted, and the rotator, under the policy, still rotates: a new CA
// reaches both configurations.
func TestCertRotatorMayChangeOnlyTheCABundle(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	wh := startWebhook(t, framework.WebhookOptions{Selector: map[string]string{"e2e-rotator-policy": "true"}})
	rotator, err := kubernetes.NewForConfig(impersonating(framework.CertRotatorUser,
		"system:serviceaccounts", "system:serviceaccounts:resclass-system", "system:authenticated"))
	if err != nil {
		t.Fatal(err)
	}
	vwcs := rotator.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	mwcs := rotator.AdmissionregistrationV1().MutatingWebhookConfigurations()
	dryRun := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
	// tryValidating applies change to the validating configuration as the
	// rotator reads it and updates it, dry run.
	tryValidating := func(ctx context.Context, change func(*admissionregistrationv1.ValidatingWebhookConfiguration)) error {
		vwc, err := vwcs.Get(ctx, wh.Config.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(vwc)
		_, err = vwcs.Update(ctx, vwc, dryRun)
		return err
	}
	otherURL := "https://attacker.example:8443/validate"
	toOtherURL := func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
		c.Webhooks[0].ClientConfig.URL, c.Webhooks[0].ClientConfig.Service = &otherURL, nil
	}
	// The policy is watched into the apiserver's cache: wait for its first
	// refusal before reading anything into the others.
	poll(t, ctx, time.Minute, "the cert rotator's policy enforced", func(ctx context.Context) (bool, error) {
		return apierrors.IsForbidden(tryValidating(ctx, toOtherURL)), nil
	})

	for what, change := range map[string]func(*admissionregistrationv1.ValidatingWebhookConfiguration){
		"pointing a webhook at another URL": toOtherURL,
		"pointing a webhook at another Service": func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
			c.Webhooks[0].ClientConfig.URL = nil
			c.Webhooks[0].ClientConfig.Service = &admissionregistrationv1.ServiceReference{Namespace: "attacker", Name: "hook", Path: ptrTo("/validate"), Port: ptrTo(int32(443))}
		},
		"widening a webhook's rules to Secrets": func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
			c.Webhooks[0].Rules = append(c.Webhooks[0].Rules, admissionregistrationv1.RuleWithOperations{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.OperationAll},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"secrets"}},
			})
		},
		"setting failurePolicy Ignore": func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
			for i := range c.Webhooks {
				c.Webhooks[i].FailurePolicy = ptrTo(admissionregistrationv1.Ignore)
			}
		},
		"emptying a namespaceSelector": func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
			c.Webhooks[0].NamespaceSelector = &metav1.LabelSelector{}
		},
		"adding a matchCondition that skips everything": func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
			c.Webhooks[0].MatchConditions = append(c.Webhooks[0].MatchConditions, admissionregistrationv1.MatchCondition{Name: "never", Expression: "false"})
		},
		"removing a webhook": func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
			c.Webhooks = c.Webhooks[1:]
		},
		"reordering the webhooks": func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
			c.Webhooks[0], c.Webhooks[1] = c.Webhooks[1], c.Webhooks[0]
		},
	} {
		wantForbiddenSaying(t, "the cert rotator "+what, tryValidating(ctx, change), rotatorOnlyCABundle)
	}
	for what, change := range map[string]func(*admissionregistrationv1.ValidatingWebhookConfiguration){
		"adding a label": func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
			c.Labels = map[string]string{"example.com/owner": "rotator"}
		},
		"adding an annotation": func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
			c.Annotations = map[string]string{"cert-manager.io/inject-ca-from": "attacker/ca"}
		},
	} {
		wantForbiddenSaying(t, "the cert rotator "+what, tryValidating(ctx, change), rotatorNoMetadata)
	}
	// The mutating configuration is held the same way.
	mwc, err := mwcs.Get(ctx, wh.Mutating.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mwc.Webhooks[0].ClientConfig.URL, mwc.Webhooks[0].ClientConfig.Service = &otherURL, nil
	mwc.Webhooks[0].ReinvocationPolicy = ptrTo(admissionregistrationv1.IfNeededReinvocationPolicy)
	_, err = mwcs.Update(ctx, mwc, dryRun)
	wantForbiddenSaying(t, "the cert rotator pointing the mutating webhook elsewhere", err, rotatorOnlyCABundle)

	// Its job: a caBundle of every webhook, both configurations.
	bundle := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	if err := tryValidating(ctx, func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
		for i := range c.Webhooks {
			c.Webhooks[i].ClientConfig.CABundle = bundle
		}
	}); err != nil {
		t.Errorf("the cert rotator changing the validating webhooks' caBundle: %v", err)
	}
	if mwc, err = mwcs.Get(ctx, wh.Mutating.Name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range mwc.Webhooks {
		mwc.Webhooks[i].ClientConfig.CABundle = bundle
	}
	if _, err := mwcs.Update(ctx, mwc, dryRun); err != nil {
		t.Errorf("the cert rotator changing the mutating webhook's caBundle: %v", err)
	}

	// Create, delete, and another configuration than its own: its RBAC
	// grants none of them; granted them, the policy still refuses.
	grant(t, ctx, framework.CertRotatorUser, "", rbacv1.PolicyRule{APIGroups: []string{admissionregistrationv1.GroupName},
		Resources: []string{"validatingwebhookconfigurations"}, Verbs: []string{"create", "delete", "update"}})
	// A configuration that matches nothing the cluster serves.
	other, err := cluster.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-not-the-rotators"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "nothing.e2e.example.com",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptrTo("https://127.0.0.1:1/nothing")},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{"e2e.example.com"}, APIVersions: []string{"v1"}, Resources: []string{"nothings"}}}},
			SideEffects:             ptrTo(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			FailurePolicy:           ptrTo(admissionregistrationv1.Ignore),
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), other.Name, metav1.DeleteOptions{})
	})
	other.Webhooks[0].ClientConfig.CABundle = bundle
	_, err = vwcs.Update(ctx, other, dryRun)
	wantForbiddenSaying(t, "the cert rotator changing another configuration's caBundle", err, "the cert rotator may write only the resclass-webhook configurations")
	made := wh.Config.DeepCopy()
	made.ObjectMeta = metav1.ObjectMeta{Name: "e2e-made-by-the-rotator"}
	_, err = vwcs.Create(ctx, made, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	wantForbiddenSaying(t, "the cert rotator creating a webhook configuration", err, rotatorNoCreate)
	err = vwcs.Delete(ctx, wh.Config.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	wantForbiddenSaying(t, "the cert rotator deleting a webhook configuration", err, rotatorNoCreate)

	// And it still rotates under the policy: a CA that no longer parses is
	// replaced, and the new one reaches both configurations.
	secrets := cluster.Client.CoreV1().Secrets("resclass-system")
	secret, err := secrets.Get(ctx, "resclass-webhook-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	oldCA := secret.Data["ca.crt"]
	secret.Data["ca.crt"] = []byte("not a certificate")
	if _, err := secrets.Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	admin := cluster.Client.AdmissionregistrationV1()
	poll(t, ctx, time.Minute, "a new CA in both configurations' caBundle", func(ctx context.Context) (bool, error) {
		vwc, err := admin.ValidatingWebhookConfigurations().Get(ctx, wh.Config.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		mwc, err := admin.MutatingWebhookConfigurations().Get(ctx, wh.Mutating.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		var all []admissionregistrationv1.WebhookClientConfig
		for _, w := range vwc.Webhooks {
			all = append(all, w.ClientConfig)
		}
		for _, w := range mwc.Webhooks {
			all = append(all, w.ClientConfig)
		}
		for _, cc := range all {
			if len(cc.CABundle) == 0 || bytes.Equal(cc.CABundle, oldCA) {
				return false, nil
			}
		}
		return true, nil
	})
}

// TestWebhookMetricsVerifiable: with --metrics-cert-from-cert-dir (what the
// Helm chart passes with cert-manager), the webhook's /metrics serves the
// certificate of its TLS Secret, so a scraper verifies it against the
// Secret's ca.crt and the Service's name, as the chart's PodMonitor does,
// and refuses the scrape without a token.
func TestWebhookMetricsVerifiable(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	wh := startWebhook(t, framework.WebhookOptions{Selector: map[string]string{"e2e-metrics-tls": "true"},
		Args: []string{"--metrics-secure=true", "--metrics-cert-from-cert-dir"}})
	secret, err := cluster.Client.CoreV1().Secrets("resclass-system").Get(ctx, "resclass-webhook-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(secret.Data["ca.crt"]) {
		t.Fatalf("the Secret's ca.crt holds no certificate")
	}
	url := strings.Replace(wh.MetricsURL, "http://", "https://", 1)
	scraper := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: roots, ServerName: "resclass-webhook.resclass-system.svc", MinVersion: tls.VersionTLS12}}}
	var status int
	poll(t, ctx, time.Minute, "/metrics verified against the Secret's ca.crt", func(ctx context.Context) (bool, error) {
		resp, err := scraper.Get(url)
		if err != nil {
			t.Logf("scrape: %v", err)
			return false, nil
		}
		_ = resp.Body.Close()
		status = resp.StatusCode
		return true, nil
	})
	if status != http.StatusUnauthorized && status != http.StatusForbidden {
		t.Errorf("a scrape without a token: HTTP %d, want 401 or 403", status)
	}
}
