package webhook

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/resclass/resclass/pkg/distribution"
)

// Cert management modes: who writes the serving certificate's Secret and the
// webhook configuration's caBundle.
const (
	// CertManagementSelf: the webhook does (open-policy-agent/cert-controller): a
	// self-signed CA and serving certificate in the Secret, rotated before expiry,
	// the CA injected into the ValidatingWebhookConfiguration.
	CertManagementSelf = "self"
	// CertManagementExternal: someone else does, typically cert-manager (a
	// Certificate writing the Secret, its cainjector the caBundle).
	CertManagementExternal = "external"
)

// What one process of the binary runs (--mode).
const (
	// ModeWebhook serves the admission webhooks, under the identity
	// resclass-webhook, which may read no Secret but its own.
	ModeWebhook = "webhook"
	// ModeDistributionController runs the ResourceDistribution controller,
	// under its own identity (resclass-distribution): the one that may write
	// Secrets and ConfigMaps in other namespaces, fenced by admission policy.
	ModeDistributionController = "distribution-controller"
)

// Options are the webhook binary's flags.
type Options struct {
	Mode string

	Kubeconfig string
	Namespace  string

	Host string
	Port int

	CertDir                   string
	CertManagement            string
	CertFromSecret            bool
	TLSSecret                 string
	ServiceName               string
	ExtraDNSNames             []string
	WebhookConfigName         string
	MutatingWebhookConfigName string

	QuotaConfig         string
	QuotaReloadInterval time.Duration

	AllowEmptyNamespaceSelector bool

	MetricsAddr   string
	MetricsSecure bool
	HealthAddr    string
	PprofAddr     string

	LeaderElect   bool
	LeaderElectID string

	KubeAPIQPS                   float32
	KubeAPIBurst                 int
	DistributionWorkers          int
	DistributionAuthorizationTTL time.Duration
}

// NewOptions returns the defaults, which match deploy/webhook.
func NewOptions() *Options {
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = "resclass-system"
	}
	return &Options{
		Mode:                         ModeWebhook,
		MutatingWebhookConfigName:    "resclass-webhook",
		DistributionAuthorizationTTL: distribution.DefaultAuthorizationTTL,
		Namespace:                    ns,
		Port:                         9443,
		CertDir:                      "/tmp/resclass-webhook/serving-certs",
		CertManagement:               CertManagementSelf,
		CertFromSecret:               true,
		TLSSecret:                    "resclass-webhook-tls",
		ServiceName:                  "resclass-webhook",
		WebhookConfigName:            "resclass-webhook",
		QuotaReloadInterval:          10 * time.Second,
		MetricsAddr:                  ":8443",
		MetricsSecure:                true,
		HealthAddr:                   ":8081",
		LeaderElect:                  true,
		KubeAPIQPS:                   100,
		KubeAPIBurst:                 200,
		DistributionWorkers:          16,
	}
}

// AddFlags registers every option on fs, each with what it is for.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Mode, "mode", o.Mode,
		`What this process runs. "webhook": the admission webhooks (deploy/webhook, ServiceAccount resclass-webhook). "distribution-controller": the ResourceDistribution controller (deploy/distribution, ServiceAccount resclass-distribution), which writes the copies; the --webhook-*, --cert-*, --tls-secret, --service-name, --extra-dns-names, --*webhook-configuration and --quota-config* flags do not apply to it. Run each as its own Deployment: the two identities are kept apart on purpose (docs/distribution.md).`)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig,
		"Kubeconfig to reach the apiserver with. Empty: the in-cluster ServiceAccount.")
	fs.StringVar(&o.Namespace, "namespace", o.Namespace,
		"Namespace the webhook runs in: its TLS Secret, leader-election Lease and Service live there. Defaults to $POD_NAMESPACE, else resclass-system.")

	fs.StringVar(&o.Host, "webhook-host", o.Host, "Address the admission webhooks listen on; empty means all interfaces.")
	fs.IntVar(&o.Port, "webhook-port", o.Port, "Port the admission webhooks listen on (HTTPS).")

	fs.StringVar(&o.CertDir, "cert-dir", o.CertDir,
		"Directory holding the serving certificate (tls.crt, tls.key). Reloaded when the files change: rotation needs no restart.")
	fs.StringVar(&o.CertManagement, "cert-management", o.CertManagement,
		`Who issues the serving certificate. "self": the webhook keeps a self-signed CA and certificate in --tls-secret, rotates them before they expire and injects the CA into the ValidatingWebhookConfiguration --webhook-configuration. "external": cert-manager (or anyone) writes --tls-secret and the caBundle; see docs/webhook.md.`)
	fs.BoolVar(&o.CertFromSecret, "cert-from-secret", o.CertFromSecret,
		"Copy tls.crt and tls.key from --tls-secret into --cert-dir as soon as the Secret changes (an emptyDir is enough). False: --cert-dir is the Secret mounted as a volume, which the kubelet refreshes only every minute or so.")
	fs.StringVar(&o.TLSSecret, "tls-secret", o.TLSSecret, "Secret (in --namespace) holding the serving certificate.")
	fs.StringVar(&o.ServiceName, "service-name", o.ServiceName,
		"Service the apiserver reaches the webhook through; the certificate is issued for <service-name>.<namespace>.svc.")
	fs.StringSliceVar(&o.ExtraDNSNames, "extra-dns-names", o.ExtraDNSNames,
		"More DNS names for the self-issued certificate, e.g. localhost when the webhook configuration uses a url.")
	fs.StringVar(&o.WebhookConfigName, "webhook-configuration", o.WebhookConfigName,
		"ValidatingWebhookConfiguration whose caBundle the webhook keeps current (--cert-management=self).")
	fs.StringVar(&o.MutatingWebhookConfigName, "mutating-webhook-configuration", o.MutatingWebhookConfigName,
		"MutatingWebhookConfiguration (it records a ResourceDistribution's author) whose caBundle the webhook keeps current (--cert-management=self).")

	fs.StringVar(&o.QuotaConfig, "quota-config", o.QuotaConfig,
		"File with the covering-quota rule, in the apiserver's ResourceQuotaConfiguration schema (or an AdmissionConfiguration holding one), usually a mounted ConfigMap. Reloaded on change; an invalid file is reported and the last good one kept. Empty: no limited scopes or resources.")
	fs.DurationVar(&o.QuotaReloadInterval, "quota-config-reload-interval", o.QuotaReloadInterval,
		"How often --quota-config is checked for changes.")

	fs.BoolVar(&o.AllowEmptyNamespaceSelector, "allow-empty-namespace-selector", o.AllowEmptyNamespaceSelector,
		"Admit pod (anti-)affinity terms with namespaceSelector: {} (upstream Kubernetes reads it as all namespaces). By default they are rejected, as the namespaceSelector proposal asks.")

	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", o.MetricsAddr, `Address of the Prometheus /metrics endpoint; "0" turns it off.`)
	fs.BoolVar(&o.MetricsSecure, "metrics-secure", o.MetricsSecure,
		"Serve /metrics over HTTPS and let only callers authorized to GET the non-resource URL /metrics in (TokenReview and SubjectAccessReview).")
	fs.StringVar(&o.HealthAddr, "health-probe-bind-address", o.HealthAddr, "Address of /healthz and /readyz.")
	fs.StringVar(&o.PprofAddr, "pprof-bind-address", o.PprofAddr, "Address of Go's /debug/pprof profiles, for diagnosing CPU or memory use; empty (the default) turns them off. Bind it to localhost: the endpoint has no authentication.")

	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect,
		"Elect a leader among replicas: for certificate rotation (--mode=webhook; every replica serves the webhooks) or the ResourceDistribution controller (--mode=distribution-controller).")
	fs.StringVar(&o.LeaderElectID, "leader-election-id", o.LeaderElectID,
		"Name of the leader-election Lease in --namespace. Default: resclass-webhook, or resclass-distribution with --mode=distribution-controller (the RBAC grants each identity its Lease by name).")

	fs.Float32Var(&o.KubeAPIQPS, "kube-api-qps", o.KubeAPIQPS,
		"Requests per second to the apiserver, sustained. The ResourceDistribution controller writes one object per target namespace, so this bounds how fast a distribution over many namespaces converges.")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", o.KubeAPIBurst, "Requests to the apiserver allowed in a burst above --kube-api-qps.")
	fs.IntVar(&o.DistributionWorkers, "distribution-workers", o.DistributionWorkers,
		"Copies one ResourceDistribution reconcile writes at once (--mode=distribution-controller).")
	fs.DurationVar(&o.DistributionAuthorizationTTL, "distribution-authorization-ttl", o.DistributionAuthorizationTTL,
		"How long the ResourceDistribution controller reuses a SubjectAccessReview answer (may the author create/update/delete the copy in this namespace?): a revoked permission stops writes within this time. 0 asks before every write. At most 5m.")
}

// leaderElectionID is --leader-election-id, or the mode's own Lease.
func (o *Options) leaderElectionID() string {
	switch {
	case o.LeaderElectID != "":
		return o.LeaderElectID
	case o.Mode == ModeDistributionController:
		return "resclass-distribution"
	}
	return "resclass-webhook"
}

// Validate reports flags that cannot work together.
func (o *Options) Validate() error {
	var errs []string
	if o.Mode != ModeWebhook && o.Mode != ModeDistributionController {
		errs = append(errs, fmt.Sprintf("--mode=%q: want %q or %q", o.Mode, ModeWebhook, ModeDistributionController))
	}
	if o.DistributionAuthorizationTTL < 0 || o.DistributionAuthorizationTTL > 5*time.Minute {
		errs = append(errs, fmt.Sprintf("--distribution-authorization-ttl=%s: want 0 to 5m", o.DistributionAuthorizationTTL))
	}
	if o.CertManagement != CertManagementSelf && o.CertManagement != CertManagementExternal {
		errs = append(errs, fmt.Sprintf("--cert-management=%q: want %q or %q", o.CertManagement, CertManagementSelf, CertManagementExternal))
	}
	if o.Port <= 0 || o.Port > 65535 {
		errs = append(errs, fmt.Sprintf("--webhook-port=%d: want 1-65535", o.Port))
	}
	if o.Namespace == "" {
		errs = append(errs, "--namespace must not be empty")
	}
	if o.CertDir == "" {
		errs = append(errs, "--cert-dir must not be empty")
	}
	if (o.CertFromSecret || o.CertManagement == CertManagementSelf) && o.TLSSecret == "" {
		errs = append(errs, "--tls-secret must name a Secret")
	}
	if o.CertManagement == CertManagementSelf && (o.ServiceName == "" || o.WebhookConfigName == "" || o.MutatingWebhookConfigName == "") {
		errs = append(errs, "--cert-management=self needs --service-name, --webhook-configuration and --mutating-webhook-configuration")
	}
	if o.KubeAPIQPS <= 0 || o.KubeAPIBurst <= 0 || o.DistributionWorkers <= 0 {
		errs = append(errs, "--kube-api-qps, --kube-api-burst and --distribution-workers must be positive")
	}
	if o.QuotaReloadInterval <= 0 {
		errs = append(errs, "--quota-config-reload-interval must be positive")
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}
