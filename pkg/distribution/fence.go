package distribution

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	sigsjson "sigs.k8s.io/json"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// What a copy may be, beyond what the author's rights allow: the same lists
// are in the admission policy resclass-distribution-writes
// (deploy/distribution/policy.yaml), which holds the controller's own writes
// to them whether the webhook runs or not; deploy's tests compare the two.
// docs/distribution.md, "What a copy may be".

// DistributableSecretTypes are the Secret types a distribution may copy: the
// ones that carry data for a workload to read. Every other type is refused,
// built-in or custom: a type is a contract with whoever reads it, and the
// apiserver and its controllers read some as credentials of the cluster
// itself (kubernetes.io/service-account-token, which the token controller
// fills with a token of the ServiceAccount it names;
// bootstrap.kubernetes.io/token, which the bootstrap authenticator accepts
// as a login), while a custom type means what its reader makes of it (Helm
// keeps its release records as helm.sh/release.v1). An allow-list stays
// safe when a new credential type appears; a deny-list would not.
var DistributableSecretTypes = []corev1.SecretType{
	corev1.SecretTypeOpaque,
	corev1.SecretTypeTLS,
	corev1.SecretTypeDockerConfigJson,
	corev1.SecretTypeDockercfg,
	corev1.SecretTypeBasicAuth,
	corev1.SecretTypeSSHAuth,
}

// ReservedName is a ConfigMap that the control plane or a cluster installer
// reads by its name, so a copy of that name would be read as the cluster's
// own: a client CA, an identity mapping, a join endpoint, a component's
// configuration. A copy never overwrites an existing object (a foreign one
// is a conflict), but these can be absent for a moment (a new namespace
// before the root CA publisher fills it) or on purpose (aws-auth before the
// first mapping), and a copy created then would be trusted.
type ReservedName struct {
	// Namespace is where the name is reserved; "" is every namespace.
	Namespace string
	Name      string
	// Why says who reads it, for the denial.
	Why string
}

// ReservedConfigMapNames are the ConfigMap names a copy may not take. The
// list cannot be complete (any add-on may read a name of its own in
// kube-system): what it leaves out is residual risk, and includedNamespaces
// is the only way into kube-system or kube-public.
var ReservedConfigMapNames = []ReservedName{
	{"", "kube-root-ca.crt", "the root CA publisher's: every pod's ServiceAccount volume trusts it as the apiserver's CA"},
	{metav1NamespaceSystem, "extension-apiserver-authentication", "the apiserver's client and front-proxy CAs, which aggregated apiservers trust"},
	{metav1NamespaceSystem, "aws-auth", "EKS maps IAM identities to users and groups with it"},
	{metav1NamespaceSystem, "kubeadm-config", "kubeadm's cluster configuration"},
	{metav1NamespaceSystem, "kubelet-config", "kubeadm's kubelet configuration"},
	{metav1NamespaceSystem, "kube-proxy", "kube-proxy's configuration and kubeconfig"},
	{metav1NamespaceSystem, "coredns", "the cluster DNS's configuration"},
	{metav1NamespacePublic, "cluster-info", "the cluster's CA and endpoint that joining nodes discover"},
}

const (
	metav1NamespaceSystem = "kube-system"
	metav1NamespacePublic = "kube-public"
)

// secretTypeAllowed reports whether a copy may be a Secret of type t (empty
// is Opaque, as the apiserver stores it).
func secretTypeAllowed(t corev1.SecretType) bool {
	return t == "" || slices.Contains(DistributableSecretTypes, t)
}

func secretTypeErrors(t corev1.SecretType, path *field.Path) field.ErrorList {
	if secretTypeAllowed(t) {
		return nil
	}
	allowed := make([]string, len(DistributableSecretTypes))
	for i, a := range DistributableSecretTypes {
		allowed[i] = string(a)
	}
	e := field.NotSupported(path, string(t), allowed)
	e.Detail = "a distribution copies only Secrets of these types: other types are read by the cluster or by a tool as more than data " +
		"(a service-account or bootstrap token is a credential of the cluster; a custom type means what its reader makes of it); " +
		"distribute the data as Opaque, or create the Secret where it is needed; " + e.Detail
	return field.ErrorList{e}
}

// ReservedNameErrors refuses a distribution whose copy would take a name
// ReservedConfigMapNames holds, in a namespace its targets name: a reserved
// name everywhere is refused whatever the targets; one reserved in
// kube-system or kube-public only when includedNamespaces names that
// namespace (the only way a distribution reaches it). res may be nil (a
// resource that did not parse has no name to judge).
func ReservedNameErrors(res *Resource, targets *v1alpha1.ResourceDistributionTargets, spec *field.Path) field.ErrorList {
	if res == nil || res.Kind != KindConfigMap {
		return nil
	}
	var errs field.ErrorList
	for _, r := range ReservedConfigMapNames {
		if r.Name != res.Name {
			continue
		}
		if r.Namespace == "" {
			errs = append(errs, field.Forbidden(spec.Child("resource", "metadata", "name"),
				fmt.Sprintf("a copy may not be the ConfigMap %q, %s; rename the ConfigMap", r.Name, r.Why)))
			continue
		}
		for i, ns := range targets.IncludedNamespaces {
			if ns.Name == r.Namespace {
				errs = append(errs, field.Forbidden(spec.Child("targets", "includedNamespaces").Index(i),
					fmt.Sprintf("a copy may not be the ConfigMap %s/%s, %s; rename the ConfigMap or leave %s out", r.Namespace, r.Name, r.Why, r.Namespace)))
			}
		}
	}
	return errs
}

// KindOf is the kind (KindSecret or KindConfigMap) a stored resource names,
// "" if it names neither or cannot be read. A distribution written before a
// rule here refused it (a Secret type no longer distributable) no longer
// parses, yet its copies exist: deleting it must still be asked for where
// they are, and that needs only the kind.
func KindOf(raw runtime.RawExtension) string {
	data, err := rawJSON(raw)
	if err != nil {
		return ""
	}
	var top struct {
		Kind string `json:"kind"`
	}
	// Case-sensitive, as ParseResource reads it.
	if sigsjson.UnmarshalCaseSensitivePreserveInts(data, &top) != nil || (top.Kind != KindSecret && top.Kind != KindConfigMap) {
		return ""
	}
	return top.Kind
}

// reservedIn is ReservedConfigMapNames as the admission policy writes it,
// for the test that compares them: "name" for every namespace, else
// "namespace/name".
func reservedIn() []string {
	var out []string
	for _, r := range ReservedConfigMapNames {
		out = append(out, strings.TrimPrefix(r.Namespace+"/"+r.Name, "/"))
	}
	return out
}
