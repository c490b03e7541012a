package webhook

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/resclass/resclass/pkg/distribution"
	"github.com/resclass/resclass/pkg/servingcert"
)

// What one process of the binary runs (--mode).
const (
	// ModeWebhook serves the admission webhooks, under the identity
	// resclass-webhook, which may read and write no Secret: it serves the
	// certificate the kubelet projects from the mounted TLS Secret.
	ModeWebhook = "webhook"
	// ModeCertRotator keeps the webhook's TLS Secret (a self-signed CA and a
	// serving certificate, renewed before they expire) and the webhook
	// configurations' caBundle, under its own identity
	// (resclass-webhook-certs), which may read and write that one Secret and
	// those two configurations, by name. Not deployed with cert-manager.
	ModeCertRotator = "cert-rotator"
	// ModeDistributionController runs the ResourceDistribution controller,
	// under its own identity (resclass-distribution): the one that may write
	// Secrets and ConfigMaps in other namespaces, fenced by admission policy.
	ModeDistributionController = "distribution-controller"
)

// DefaultMaxInFlight is --max-in-flight's default. A pod admission takes
// about a millisecond of CPU (BenchmarkAdmission: p99 2.5 ms at 2000 a
// second, with a few requests in flight); 200 at once on the two cores a
// replica may get is already about 100 ms of queue for the last, and the
// pod webhook's timeout is 3 s. A ResourceDistribution admission may wait
// seconds on SubjectAccessReviews, which the bound leaves room for.
const DefaultMaxInFlight = 200

// Defaults of the ResourceDistribution admission's review flags. At 2000
// reviews a second (bursts of as many), 10 000 namespaces take 4 s of the
// limiter's time, within an admission's 8 s (the webhook's 10 s timeout less
// the margin, reviewBudget). An apiserver slower than that needs the request
// sent again, and the answers must outlive a few tries: on the e2e apiserver
// (about 650 reviews a second) 10 000 took 2 to 4 tries of 8 s, and with a
// 10 s TTL the first try's answers expired before the third
// (docs/distribution.md, "At 10 000 namespaces").
const (
	DefaultDistributionMaxNamespaceReviews = 10_000
	DefaultDistributionReviewQPS           = 2000
	DefaultDistributionReviewTTL           = 30 * time.Second
)

// Options are the webhook binary's flags.
type Options struct {
	Mode string

	Kubeconfig string
	Namespace  string

	Host string
	Port int

	CertDir                   string
	TLSSecret                 string
	CertValidity              time.Duration
	CertRenewBefore           time.Duration
	ServiceName               string
	ExtraDNSNames             []string
	WebhookConfigName         string
	MutatingWebhookConfigName string

	QuotaConfig         string
	QuotaReloadInterval time.Duration

	// AllowEmptyNamespaceSelector is the old flag, now the default.
	AllowEmptyNamespaceSelector bool
	// RefuseEmptyNamespaceSelector refuses affinity terms with
	// namespaceSelector {}; off unless the install turns the policy on.
	RefuseEmptyNamespaceSelector bool
	// MatchConditionsCover says what the rendered matchConditions send the
	// pods webhook (--match-conditions-cover), so that a rule in force that
	// they leave out is reported.
	MatchConditionsCover []string
	// QuotaConfigMap names the ConfigMap that holds --quota-config, for the
	// Event that reports an uncovered rule.
	QuotaConfigMap string

	// MaxInFlight bounds the admission requests served at once; beyond it
	// they are shed with HTTP 429. 0: no bound.
	MaxInFlight int

	MetricsAddr   string
	MetricsSecure bool
	HealthAddr    string
	PprofAddr     string
	// MetricsCertFromCertDir serves /metrics (webhook mode) with the
	// serving certificate in CertDir, which a scraper can verify against
	// the TLS Secret's ca.crt, instead of one self-signed at start.
	MetricsCertFromCertDir bool

	LeaderElect   bool
	LeaderElectID string

	KubeAPIQPS                   float32
	KubeAPIBurst                 int
	DistributionWorkers          int
	DistributionAuthorizationTTL time.Duration
	DistributionStatusMaxCopies  int
	// DistributionAuthorMaxAge, when positive, is how long the controller
	// replays a distribution's author record before it needs writing again.
	DistributionAuthorMaxAge time.Duration
	// DistributionMaxNamespaceReviews bounds the SubjectAccessReviews one
	// ResourceDistribution admission asks per verb beyond the cluster-wide one.
	DistributionMaxNamespaceReviews int
	// DistributionReviewQPS paces the SubjectAccessReviews of every
	// ResourceDistribution admission together, on a client of their own.
	DistributionReviewQPS float32
	// DistributionReviewTTL is how long admission reuses a review's answer.
	DistributionReviewTTL time.Duration
	// NodeAgentNamespace is protected from distributions like --namespace.
	NodeAgentNamespace string
}

// protectedNamespaces are resclass's own namespaces, which distributions
// reach only by naming them in includedNamespaces (besides kube-system and
// kube-public).
func (o *Options) protectedNamespaces() []string {
	return []string{o.Namespace, o.NodeAgentNamespace}
}

// NewOptions returns the defaults, which match deploy/webhook.
func NewOptions() *Options {
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = "resclass-system"
	}
	return &Options{
		Mode:                            ModeWebhook,
		MutatingWebhookConfigName:       "resclass-webhook",
		DistributionAuthorizationTTL:    distribution.DefaultAuthorizationTTL,
		DistributionStatusMaxCopies:     distribution.DefaultMaxStatusCopies,
		DistributionMaxNamespaceReviews: DefaultDistributionMaxNamespaceReviews,
		DistributionReviewQPS:           DefaultDistributionReviewQPS,
		DistributionReviewTTL:           DefaultDistributionReviewTTL,
		Namespace:                       ns,
		Port:                            9443,
		CertDir:                         "/tmp/resclass-webhook/serving-certs",
		TLSSecret:                       "resclass-webhook-tls",
		CertValidity:                    servingcert.DefaultCertValidity,
		CertRenewBefore:                 servingcert.DefaultRenewBefore,
		ServiceName:                     "resclass-webhook",
		WebhookConfigName:               "resclass-webhook",
		QuotaReloadInterval:             10 * time.Second,
		MaxInFlight:                     DefaultMaxInFlight,
		MatchConditionsCover:            []string{coverAll},
		QuotaConfigMap:                  "resclass-webhook-quota",
		MetricsAddr:                     ":8443",
		MetricsSecure:                   true,
		HealthAddr:                      ":8081",
		LeaderElect:                     true,
		LeaderElectID:                   "resclass-distribution",
		KubeAPIQPS:                      100,
		KubeAPIBurst:                    200,
		DistributionWorkers:             16,
		NodeAgentNamespace:              "resclass-node",
	}
}

// AddFlags registers every option on fs, each with what it is for.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Mode, "mode", o.Mode,
		`What this process runs; each is its own Deployment under its own ServiceAccount, kept apart on purpose (docs/webhook.md, docs/distribution.md). "webhook": the admission webhooks (deploy/webhook, ServiceAccount resclass-webhook), serving the certificate in --cert-dir. "cert-rotator": keeps the TLS Secret --tls-secret (a self-signed CA and the serving certificate, renewed before they expire) and the caBundle of --webhook-configuration and --mutating-webhook-configuration (deploy/webhook, ServiceAccount resclass-webhook-certs; leave it out with cert-manager). "distribution-controller": the ResourceDistribution controller (deploy/distribution, ServiceAccount resclass-distribution), which writes the copies.`)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig,
		"Kubeconfig to reach the apiserver with. Empty: the in-cluster ServiceAccount.")
	fs.StringVar(&o.Namespace, "namespace", o.Namespace,
		"Namespace the webhook runs in: its TLS Secret, leader-election Lease and Service live there. Defaults to $POD_NAMESPACE, else resclass-system.")

	fs.StringVar(&o.NodeAgentNamespace, "node-agent-namespace", o.NodeAgentNamespace,
		"(--mode=webhook, --mode=distribution-controller) The node agent's namespace. Like --namespace, kube-system and kube-public it is protected: a ResourceDistribution writes there only when its includedNamespaces names it.")

	fs.StringVar(&o.Host, "webhook-host", o.Host, "Address the admission webhooks listen on; empty means all interfaces.")
	fs.IntVar(&o.Port, "webhook-port", o.Port, "Port the admission webhooks listen on (HTTPS).")

	fs.StringVar(&o.CertDir, "cert-dir", o.CertDir,
		"(--mode=webhook) Directory holding the serving certificate (tls.crt, tls.key): the TLS Secret mounted as a volume. Reloaded when the files change (within 10s), so a renewal needs no restart. The webhook waits, unready, until both files are there.")
	fs.StringVar(&o.TLSSecret, "tls-secret", o.TLSSecret, "(--mode=cert-rotator) Secret in --namespace that holds the CA and the serving certificate. It must exist: the rotator fills it but may not create Secrets.")
	fs.StringVar(&o.ServiceName, "service-name", o.ServiceName,
		"(--mode=cert-rotator) Service the apiserver reaches the webhook through: the certificate is issued for <service-name>.<namespace>.svc and <service-name>.<namespace>.svc.cluster.local.")
	fs.StringSliceVar(&o.ExtraDNSNames, "extra-dns-names", o.ExtraDNSNames,
		"(--mode=cert-rotator) More DNS names for the certificate, e.g. localhost when the webhook configuration uses a url.")
	fs.StringVar(&o.WebhookConfigName, "webhook-configuration", o.WebhookConfigName,
		"(--mode=cert-rotator) ValidatingWebhookConfiguration whose caBundle the rotator keeps current.")
	fs.StringVar(&o.MutatingWebhookConfigName, "mutating-webhook-configuration", o.MutatingWebhookConfigName,
		"(--mode=cert-rotator) MutatingWebhookConfiguration (it records a ResourceDistribution's author) whose caBundle the rotator keeps current.")
	fs.DurationVar(&o.CertValidity, "cert-validity", o.CertValidity,
		"(--mode=cert-rotator) How long a new serving certificate is valid (a new CA: 10 years).")
	fs.DurationVar(&o.CertRenewBefore, "cert-renew-before", o.CertRenewBefore,
		"(--mode=cert-rotator) Renew the serving certificate, or the CA, this long before it expires. Less than --cert-validity.")

	fs.StringVar(&o.QuotaConfig, "quota-config", o.QuotaConfig,
		"File with the covering-quota rule, in the apiserver's ResourceQuotaConfiguration schema (or an AdmissionConfiguration holding one), usually a mounted ConfigMap. Reloaded on change; an invalid file is reported and the last good one kept. Empty: no limited scopes or resources.")
	fs.DurationVar(&o.QuotaReloadInterval, "quota-config-reload-interval", o.QuotaReloadInterval,
		"How often --quota-config is checked for changes.")

	fs.BoolVar(&o.RefuseEmptyNamespaceSelector, "refuse-empty-namespace-selector", o.RefuseEmptyNamespaceSelector,
		"(--mode=webhook) Refuse pod (anti-)affinity terms with namespaceSelector: {}, which upstream Kubernetes reads as all namespaces, as the namespaceSelector proposal asks. Off by default: the install turns it on (Helm webhook.policies.emptyNamespaceSelector, the kustomize component deploy/webhook/policies), with the matchConditions that send such pods here.")
	fs.BoolVar(&o.AllowEmptyNamespaceSelector, "allow-empty-namespace-selector", o.AllowEmptyNamespaceSelector,
		"Deprecated: admitting namespaceSelector: {} is now the default (see --refuse-empty-namespace-selector).")
	_ = fs.MarkDeprecated("allow-empty-namespace-selector", "it is the default now; --refuse-empty-namespace-selector turns the refusal on")
	fs.StringSliceVar(&o.MatchConditionsCover, "match-conditions-cover", o.MatchConditionsCover,
		"(--mode=webhook) What the webhook configuration's matchConditions send to the pods and workloads webhooks, as the install rendered them (Helm webhook.policies, the kustomize component deploy/webhook/policies): "+
			"EmptyNamespaceSelector, CrossNamespacePodAffinity (affinity terms reaching other namespaces), PriorityClass (any priority class), PriorityClass=<name>, Contains=<substring> (a requests.<name> or limits.<name> containing it), None, or All (no matchConditions). "+
			"A rule in force that concerns pods they leave out (a --quota-config edited at run time, --refuse-empty-namespace-selector) is never enforced, as the apiserver never sends those pods: the webhook reports each such rule in its log, in a Warning Event on --quota-config-map and in resclass_webhook_quota_config_uncovered_rules; re-render the configuration with the rule. Default All: nothing is reported.")
	fs.StringVar(&o.QuotaConfigMap, "quota-config-map", o.QuotaConfigMap,
		"(--mode=webhook) The ConfigMap in --namespace that holds --quota-config: the Event reporting a rule the matchConditions do not cover is recorded on it.")

	fs.IntVar(&o.MaxInFlight, "max-in-flight", o.MaxInFlight,
		"(--mode=webhook) Admission requests served at once, all webhooks together. Beyond it a request is answered at once with HTTP 429 and a message that the webhook is overloaded and to retry (resclass_webhook_shed_requests_total), rather than queued and answered after the apiserver's timeout: the webhook's failurePolicy then decides (pods, ResourceClasses, ResourceDistributions: refused; workloads: admitted). 0: no bound. docs/webhook.md, \"Load shedding\".")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", o.MetricsAddr, `Address of the Prometheus /metrics endpoint; "0" turns it off.`)
	fs.BoolVar(&o.MetricsSecure, "metrics-secure", o.MetricsSecure,
		"Serve /metrics over HTTPS and let only callers authorized to GET the non-resource URL /metrics in (TokenReview and SubjectAccessReview).")
	fs.BoolVar(&o.MetricsCertFromCertDir, "metrics-cert-from-cert-dir", o.MetricsCertFromCertDir,
		"(--mode=webhook, with --metrics-secure) Serve /metrics with the serving certificate in --cert-dir rather than a self-signed one made at start, so that a scraper can verify it against the TLS Secret's ca.crt (cert-manager writes one; the Helm chart turns this on with webhook.certManagement: certManager). /metrics then starts once that certificate is there, as the webhook server does.")
	fs.StringVar(&o.HealthAddr, "health-probe-bind-address", o.HealthAddr, "Address of /healthz and /readyz.")
	fs.StringVar(&o.PprofAddr, "pprof-bind-address", o.PprofAddr, "Address of Go's /debug/pprof profiles, for diagnosing CPU or memory use; empty (the default) turns them off. Bind it to localhost: the endpoint has no authentication.")

	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect,
		"(--mode=distribution-controller) Elect a leader among replicas; only the leader reconciles. The webhook needs none (every replica serves), nor does the cert rotator (its writes are conditional updates: concurrent rotators cannot both win).")
	fs.StringVar(&o.LeaderElectID, "leader-election-id", o.LeaderElectID,
		"(--mode=distribution-controller) Name of the leader-election Lease in --namespace; the RBAC grants its identity that Lease by name.")

	fs.Float32Var(&o.KubeAPIQPS, "kube-api-qps", o.KubeAPIQPS,
		"Requests per second to the apiserver, sustained. The ResourceDistribution controller writes one object per target namespace, so this bounds how fast a distribution over many namespaces converges.")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", o.KubeAPIBurst, "Requests to the apiserver allowed in a burst above --kube-api-qps.")
	fs.IntVar(&o.DistributionWorkers, "distribution-workers", o.DistributionWorkers,
		"Copies one ResourceDistribution reconcile writes at once (--mode=distribution-controller).")
	fs.DurationVar(&o.DistributionAuthorizationTTL, "distribution-authorization-ttl", o.DistributionAuthorizationTTL,
		"How long the ResourceDistribution controller reuses a SubjectAccessReview answer (may the author create/update/delete the copy in this namespace?): a revoked permission stops writes within this time. 0 asks before every write. At most 5m.")
	fs.DurationVar(&o.DistributionAuthorMaxAge, "distribution-author-max-age", o.DistributionAuthorMaxAge,
		"(--mode=distribution-controller) How long a ResourceDistribution's author record is replayed: its groups are those of the request that wrote the spec, and a group removed at the identity provider is not seen. Older (counted from when the controller first saw the spec, status.authorSince), no copy is created, updated or deleted until someone writes the spec again (Authorized False, reason AuthorExpired). 0 (the default): no limit.")
	fs.IntVar(&o.DistributionMaxNamespaceReviews, "distribution-max-namespace-reviews", o.DistributionMaxNamespaceReviews,
		"(--mode=webhook) How many namespaces one ResourceDistribution admission asks a SubjectAccessReview about, per verb, when the requester may not write the kind cluster-wide (one cluster-wide review is asked first). A request that needs more is refused without asking (an update's content change only warns), with a message to ask for the right cluster-wide: the webhook answers any caller that reaches it, and this bounds what one request costs the apiserver. The default, 10000, fits the admission's time at the default --distribution-review-qps (docs/distribution.md, \"What one admission costs\").")
	fs.Float32Var(&o.DistributionReviewQPS, "distribution-review-qps", o.DistributionReviewQPS,
		"(--mode=webhook) SubjectAccessReviews per second that ResourceDistribution admissions ask, all requests together, on a client of their own (bursts of as many; --kube-api-qps does not apply to them). A request whose reviews cannot all be asked and answered within its time (the apiserver's timeout for the call, less a margin) is refused with a message saying how far it got; the answers are remembered (--distribution-review-ttl), so the same request made again goes on from there.")
	fs.DurationVar(&o.DistributionReviewTTL, "distribution-review-ttl", o.DistributionReviewTTL,
		"(--mode=webhook) How long ResourceDistribution admission reuses a SubjectAccessReview's answer, keyed by the requester's user, uid, groups and extra, the verb, the resource and the namespace: a request repeated (or made again after running out of time) asks only what it has not asked. A revoked permission is seen by admission within this time; the controller asks again before every write anyway. 0: no reuse. At most 1m.")
	fs.IntVar(&o.DistributionStatusMaxCopies, "distribution-status-max-copies", o.DistributionStatusMaxCopies,
		fmt.Sprintf("How many namespaces holding a copy a ResourceDistribution's status.distributedResources names at most (status.distributed counts them all); beyond it, deleting or shrinking the distribution needs delete in every namespace it no longer targets. 1 to %d.", distribution.MaxStatusCopiesLimit))
}

// Validate reports flags that cannot work together.
func (o *Options) Validate() error {
	var errs []string
	if o.Mode != ModeWebhook && o.Mode != ModeCertRotator && o.Mode != ModeDistributionController {
		errs = append(errs, fmt.Sprintf("--mode=%q: want %q, %q or %q", o.Mode, ModeWebhook, ModeCertRotator, ModeDistributionController))
	}
	if o.DistributionAuthorizationTTL < 0 || o.DistributionAuthorizationTTL > 5*time.Minute {
		errs = append(errs, fmt.Sprintf("--distribution-authorization-ttl=%s: want 0 to 5m", o.DistributionAuthorizationTTL))
	}
	if o.DistributionStatusMaxCopies < 1 || o.DistributionStatusMaxCopies > distribution.MaxStatusCopiesLimit {
		errs = append(errs, fmt.Sprintf("--distribution-status-max-copies=%d: want 1 to %d", o.DistributionStatusMaxCopies, distribution.MaxStatusCopiesLimit))
	}
	if o.AllowEmptyNamespaceSelector && o.RefuseEmptyNamespaceSelector {
		errs = append(errs, "--allow-empty-namespace-selector and --refuse-empty-namespace-selector contradict each other")
	}
	if _, err := parseCoverage(o.MatchConditionsCover); err != nil {
		errs = append(errs, err.Error())
	}
	if o.MaxInFlight < 0 {
		errs = append(errs, fmt.Sprintf("--max-in-flight=%d: want 0 (no bound) or more", o.MaxInFlight))
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
	if o.Mode == ModeCertRotator {
		if o.TLSSecret == "" || o.ServiceName == "" || o.WebhookConfigName == "" || o.MutatingWebhookConfigName == "" {
			errs = append(errs, "--mode=cert-rotator needs --tls-secret, --service-name, --webhook-configuration and --mutating-webhook-configuration")
		}
		if o.CertRenewBefore <= 0 || o.CertValidity <= o.CertRenewBefore {
			errs = append(errs, fmt.Sprintf("--cert-renew-before=%s must be positive and less than --cert-validity=%s", o.CertRenewBefore, o.CertValidity))
		}
	}
	if o.MetricsCertFromCertDir && (o.Mode != ModeWebhook || !o.MetricsSecure) {
		errs = append(errs, "--metrics-cert-from-cert-dir needs --mode=webhook and --metrics-secure")
	}
	if o.KubeAPIQPS <= 0 || o.KubeAPIBurst <= 0 || o.DistributionWorkers <= 0 {
		errs = append(errs, "--kube-api-qps, --kube-api-burst and --distribution-workers must be positive")
	}
	if o.DistributionAuthorMaxAge < 0 {
		errs = append(errs, "--distribution-author-max-age must not be negative")
	}
	if o.DistributionMaxNamespaceReviews < 1 {
		errs = append(errs, "--distribution-max-namespace-reviews must be at least 1")
	}
	if o.DistributionReviewQPS < 1 {
		errs = append(errs, "--distribution-review-qps must be at least 1")
	}
	if o.DistributionReviewTTL < 0 || o.DistributionReviewTTL > time.Minute {
		errs = append(errs, fmt.Sprintf("--distribution-review-ttl=%s: want 0 to 1m", o.DistributionReviewTTL))
	}
	if o.QuotaReloadInterval <= 0 {
		errs = append(errs, "--quota-config-reload-interval must be positive")
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}
