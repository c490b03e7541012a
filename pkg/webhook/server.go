// Package webhook is the resclass webhook binary. With --mode=webhook it is a
// controller-runtime manager serving the admission webhooks (ResourceClass
// validation, the pod affinity namespaceSelector and covering-quota policies,
// ResourceDistribution validation, authorization and author recording) over
// TLS from a mounted Secret, which --mode=cert-rotator (or cert-manager)
// fills and renews. With --mode=distribution-controller it runs the
// ResourceDistribution controller. Each mode is deployed apart under its own
// identity. docs/webhook.md and docs/distribution.md are the operator's guides.
package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/component-base/term"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/distribution"
	"github.com/resclass/resclass/pkg/quota"
)

// NewCommand is the webhook binary's command line.
func NewCommand() *cobra.Command {
	o := NewOptions()
	logging := logsapi.NewLoggingConfiguration()
	// The logging feature gates, which the --log-* flags' help names.
	gates := featuregate.NewFeatureGate()
	utilruntime.Must(logsapi.AddFeatureGates(gates))
	cmd := &cobra.Command{
		Use:   "webhook",
		Short: "Serve resclass's admission webhooks, or run the ResourceDistribution controller",
		Long: `webhook serves resclass's validating admission webhooks:

  /validate-resourceclasses  ResourceClass selectors compile (typed values,
                             operators that fit the attribute); spec is immutable.
  /validate-resourcedistributions
                             the resource is a complete Secret or ConfigMap whose
                             apiVersion, kind and name never change; the author
                             must be allowed to create it in every target (and to
                             delete the copies a change or a deletion removes).
  /mutate-resourcedistributions
                             records who wrote a distribution's spec (annotation
                             resclass.io/spec-author), which the controller asks
                             about before each write of a copy.
  /validate-pods             pod (anti-)affinity terms may not use an empty
                             namespaceSelector {} (with
                             --refuse-empty-namespace-selector); a pod matching a limited scope of
                             --quota-config (PriorityClass, CrossNamespacePodAffinity,
                             ...) or consuming a limited resource needs a covering
                             ResourceQuota in its namespace.
  /validate-workloads        the same two policies on the pod template of a
                             Deployment, StatefulSet, DaemonSet, ReplicaSet, Job,
                             CronJob or ReplicationController, when it is created
                             or its template changes.

Every replica serves, with the certificate in --cert-dir: the TLS Secret
mounted as a volume, reloaded when the kubelet refreshes it. The webhook's
identity reads and writes no Secret. See docs/webhook.md.

With --mode=cert-rotator the same binary keeps that Secret instead: a
self-signed CA and serving certificate, renewed before they expire, and the
CA in the webhook configurations' caBundle, under an identity that may touch
that one Secret and those two configurations (deploy/webhook; with
cert-manager, leave it out).

With --mode=distribution-controller it runs the ResourceDistribution
controller, which keeps each distribution's copies in its target namespaces,
writing only where the distribution's author could (docs/distribution.md).
Deploy it apart (deploy/distribution): it is the identity that writes Secrets
in other namespaces.`,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := logsapi.ValidateAndApply(logging, gates); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return Run(ctrl.SetupSignalHandler(), o)
		},
	}
	fss := cliflag.NamedFlagSets{}
	o.AddFlags(fss.FlagSet("webhook"))
	logsapi.AddFlags(logging, fss.FlagSet("logging"))
	gates.AddFlag(fss.FlagSet("logging"))
	for _, fs := range fss.FlagSets {
		cmd.Flags().AddFlagSet(fs)
	}
	cols, _, _ := term.TerminalSize(cmd.OutOrStdout())
	cliflag.SetUsageAndHelpFunc(cmd, fss, cols)
	return cmd
}

// Run serves until ctx is done.
func Run(ctx context.Context, o *Options) error {
	ctrl.SetLogger(klog.Background())
	log := ctrl.Log.WithName("webhook")

	cfg, err := restConfig(o.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = o.KubeAPIQPS, o.KubeAPIBurst
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	// A bad file at start is an error: better no webhook than one that
	// silently enforces nothing.
	quotaFile, err := quota.NewFile(o.QuotaConfig, o.QuotaReloadInterval, log.WithName("quota-config"))
	if err != nil {
		return fmt.Errorf("--quota-config: %w", err)
	}
	cover, err := parseCoverage(o.MatchConditionsCover)
	if err != nil {
		return err
	}
	// report is set once the manager's event recorder exists; loads before
	// that are logged and counted only.
	var report atomic.Pointer[func(uncovered []string)]
	checkCoverage := func(cfg *quota.Config) {
		uncovered := cover.uncovered(o.RefuseEmptyNamespaceSelector, cfg)
		quotaConfigUncovered.Set(float64(len(uncovered)))
		if len(uncovered) == 0 {
			return
		}
		log.Error(nil, "rules in force concern pods that the webhook configuration's matchConditions never send here, so they are not enforced: re-render the configuration with them (Helm webhook.policies, or the kustomize component's expression and --match-conditions-cover), or take them out of --quota-config",
			"uncovered", uncovered, "matchConditionsCover", o.MatchConditionsCover)
		if r := report.Load(); r != nil {
			(*r)(uncovered)
		}
	}
	quotaFile.OnLoad = func(cfg *quota.Config, err error) {
		if err != nil {
			quotaConfigLoads.WithLabelValues("invalid").Inc()
			quotaConfigValid.Set(0)
			return
		}
		quotaConfigLoads.WithLabelValues("loaded").Inc()
		quotaConfigValid.Set(1)
		logQuotaConfig(log, cfg)
		checkCoverage(cfg)
	}
	quotaConfigValid.Set(1)
	logQuotaConfig(log, quotaFile.Current())

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}

	metrics := metricsserver.Options{BindAddress: o.MetricsAddr, SecureServing: o.MetricsSecure, TLSOpts: []func(*tls.Config){http1Only}}
	if o.MetricsSecure {
		metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	switch o.Mode {
	case ModeDistributionController:
		return runDistributionController(ctx, o, cfg, scheme, metrics, clientset)
	case ModeCertRotator:
		return runCertRotator(ctx, o, cfg, scheme, metrics)
	}
	managerMetrics := metrics
	if o.MetricsCertFromCertDir {
		// Started below, once the certificate is there: the manager's
		// would fail at start on a fresh install, before the Secret is
		// filled, and restart the pod for it.
		managerMetrics = metricsserver.Options{BindAddress: "0"}
		metrics.CertDir, metrics.CertName, metrics.KeyName = o.CertDir, certFile, keyFile
	}
	mgr, err := ctrl.NewManager(cfg, managerOptions(o, scheme, managerMetrics))
	if err != nil {
		return err
	}
	if o.MetricsCertFromCertDir && o.MetricsAddr != "0" {
		if err := mgr.Add(everyReplica{manager.RunnableFunc(func(ctx context.Context) error {
			if !waitForCerts(ctx, o.CertDir, log) {
				return nil
			}
			srv, err := metricsserver.NewServer(metrics, mgr.GetConfig(), mgr.GetHTTPClient())
			if err != nil {
				return err
			}
			log.Info("serving certificate in place: serving /metrics with it", "dir", o.CertDir)
			return srv.Start(ctx)
		})}); err != nil {
			return err
		}
	}

	server := webhook.NewServer(webhook.Options{
		Host: o.Host, Port: o.Port,
		CertDir: o.CertDir, CertName: certFile, KeyName: keyFile,
		TLSOpts: []func(*tls.Config){http1Only},
	})
	// Started now so that they have synced before the first admission, which
	// reads quotas and namespaces from them and never from the apiserver.
	quotaInformer, err := mgr.GetCache().GetInformer(ctx, &corev1.ResourceQuota{})
	if err != nil {
		return err
	}
	namespaceInformer, err := mgr.GetCache().GetInformer(ctx, &corev1.Namespace{})
	if err != nil {
		return err
	}
	// The pod policies read the quota informer's store directly (no copy per
	// admission); controller-runtime's informers are client-go's.
	var quotas quotaSource = readerQuotas{mgr.GetCache()}
	if i, ok := quotaInformer.(toolscache.SharedIndexInformer); ok {
		quotas = informerQuotas{i.GetIndexer()}
	}
	// Every path shares one bound: it is the replica's CPU and memory that
	// a burst exhausts, whichever webhook it comes through.
	limit := newInFlightLimit(o.MaxInFlight)
	register := func(path string, h http.Handler) { server.Register(path, limit.wrap(path, h)) }
	register(ResourceClassesPath, &webhook.Admission{Handler: &resourceClasses{}})
	reviews, err := reviewClient(cfg)
	if err != nil {
		return err
	}
	register(ResourceDistributionsPath, reviewBudget(&webhook.Admission{Handler: &resourceDistributions{
		namespaces: mgr.GetCache(),
		authorizer: &distribution.Authorizer{
			SAR:        reviews.AuthorizationV1().SubjectAccessReviews(),
			MaxReviews: o.DistributionMaxNamespaceReviews,
			Workers:    reviewWorkers,
			TTL:        o.DistributionReviewTTL,
			MaxEntries: maxCachedReviews,
			Limiter:    flowcontrol.NewTokenBucketRateLimiter(o.DistributionReviewQPS, int(o.DistributionReviewQPS)),
		},
		protected: o.protectedNamespaces(),
	}}))
	register(ResourceDistributionAuthorPath, &webhook.Admission{Handler: resourceDistributionAuthor{}})
	// A Warning Event on the rule's ConfigMap, where the operator who edited
	// it looks (kubectl describe configmap), for each rule the matchConditions
	// leave out; checked again now that it can be recorded.
	recorder := mgr.GetEventRecorder("resclass-webhook")
	quotaConfigMap := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: o.QuotaConfigMap, Namespace: o.Namespace}}
	reportFn := func(uncovered []string) {
		recorder.Eventf(quotaConfigMap, nil, corev1.EventTypeWarning, "RuleNotCovered", "LoadQuotaConfig",
			"not enforced: the webhook configuration's matchConditions (--match-conditions-cover=%s) never send the pods these rules concern: %s; re-render the webhook configuration with them (docs/webhook.md)",
			strings.Join(o.MatchConditionsCover, ","), strings.Join(uncovered, "; "))
	}
	report.Store(&reportFn)
	if err := mgr.Add(everyReplica{manager.RunnableFunc(func(ctx context.Context) error {
		checkCoverage(quotaFile.Current())
		return nil
	})}); err != nil {
		return err
	}
	pods := &podPolicies{
		allowEmptyNamespaceSelector: !o.RefuseEmptyNamespaceSelector,
		config:                      quotaFile.Current,
		quotas:                      quotas,
	}
	register(PodsPath, &webhook.Admission{Handler: pods})
	register(WorkloadsPath, &webhook.Admission{Handler: &workloadPolicies{pods: pods}})

	if err := mgr.Add(everyReplica{quotaFile}); err != nil {
		return err
	}
	// The server starts once there is a certificate to serve: on a fresh
	// install the Secret is empty until the rotator (or cert-manager) fills
	// it and the kubelet refreshes the volume.
	if err := mgr.Add(everyReplica{manager.RunnableFunc(func(ctx context.Context) error {
		return serveWhenCertsExist(ctx, mgr, server, o.CertDir, log)
	})}); err != nil {
		return err
	}

	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("webhook-server", server.StartedChecker()); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("informers", func(*http.Request) error {
		if !quotaInformer.HasSynced() || !namespaceInformer.HasSynced() {
			return errors.New("the ResourceQuota and Namespace informers have not synced")
		}
		return nil
	}); err != nil {
		return err
	}
	// The collector's settings come from the environment (the Deployment sets
	// GOGC and GOMEMLIMIT, docs/webhook.md "Performance"); said here because
	// they decide the pod webhook's tail. debug.SetMemoryLimit(-1) only reads.
	log.Info("starting", "namespace", o.Namespace, "certDir", o.CertDir,
		"refuseEmptyNamespaceSelector", o.RefuseEmptyNamespaceSelector, "matchConditionsCover", o.MatchConditionsCover, "quotaConfig", o.QuotaConfig, "maxInFlight", o.MaxInFlight,
		"quotaReads", fmt.Sprintf("%T", quotas), "GOGC", os.Getenv("GOGC"), "memoryLimitBytes", debug.SetMemoryLimit(-1))
	return mgr.Start(ctx)
}

// runDistributionController runs the ResourceDistribution controller in the
// elected leader, until ctx is done.
func runDistributionController(ctx context.Context, o *Options, cfg *rest.Config, scheme *runtime.Scheme, metrics metricsserver.Options, clientset kubernetes.Interface) error {
	log := ctrl.Log.WithName("distribution")
	opts := managerOptions(o, scheme, metrics)
	opts.Cache = cache.Options{ByObject: map[client.Object]cache.ByObject{
		// Of all Secrets and ConfigMaps, the cache holds only the
		// ResourceDistribution copies, and of those only their metadata
		// (the controller watches them as metadata, pkg/distribution) without
		// managedFields; a same-named foreign object, or a copy about to be
		// updated, is read from the apiserver.
		&corev1.Secret{}:    {Label: copiesSelector, Transform: cache.TransformStripManagedFields()},
		&corev1.ConfigMap{}: {Label: copiesSelector, Transform: cache.TransformStripManagedFields()},
	}}
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		return err
	}
	if err := (&distribution.Reconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder("resclass-distribution"),
		Workers:   o.DistributionWorkers,
		Protected: o.protectedNamespaces(),
		// The webhook needs no such flag: status.distributed says when
		// the map is incomplete.
		MaxStatusCopies: o.DistributionStatusMaxCopies,
		AuthorMaxAge:    o.DistributionAuthorMaxAge,
		Authorizer: &distribution.Authorizer{
			SAR: clientset.AuthorizationV1().SubjectAccessReviews(),
			TTL: o.DistributionAuthorizationTTL,
		},
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("ResourceDistribution controller: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	log.Info("starting the ResourceDistribution controller", "namespace", o.Namespace, "leaderElect", o.LeaderElect,
		"workers", o.DistributionWorkers, "authorizationTTL", o.DistributionAuthorizationTTL, "statusMaxCopies", o.DistributionStatusMaxCopies)
	return mgr.Start(ctx)
}

// serveWhenCertsExist adds the webhook server to the manager once its key
// pair is on disk; controller-runtime's server refuses to start without one.
func serveWhenCertsExist(ctx context.Context, mgr manager.Manager, server webhook.Server, dir string, log logr.Logger) error {
	if !waitForCerts(ctx, dir, log) {
		return nil
	}
	log.Info("serving certificate in place: starting the webhook server", "dir", dir)
	if err := mgr.Add(server); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// waitForCerts returns true once dir holds a serving certificate and key,
// false if ctx ends first.
func waitForCerts(ctx context.Context, dir string, log logr.Logger) bool {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	waiting := time.Now()
	for !certsPresent(dir) {
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
		if time.Since(waiting) > 30*time.Second {
			log.Info("waiting for the serving certificate", "dir", dir)
			waiting = time.Now()
		}
	}
	return true
}

// copiesSelector selects the objects the ResourceDistribution controller
// writes.
var copiesSelector = labels.SelectorFromSet(nil).Add(mustRequirement(distribution.LabelDistribution, selection.Exists))

func mustRequirement(key string, op selection.Operator) labels.Requirement {
	r, err := labels.NewRequirement(key, op, nil)
	if err != nil {
		panic(err)
	}
	return *r
}

// everyReplica runs a runnable in every replica, not only the leader.
type everyReplica struct{ manager.Runnable }

func (everyReplica) NeedLeaderElection() bool { return false }

// http1Only turns HTTP/2 off, as kubebuilder's scaffolding does: the
// apiserver speaks HTTP/1.1 to webhooks, and HTTP/2 brought the stream-reset
// attacks (CVE-2023-44487, CVE-2023-39325).
func http1Only(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

func logQuotaConfig(log logr.Logger, cfg *quota.Config) {
	log.Info("covering-quota rule in force", "limitedScopes", fmt.Sprint(cfg.Scopes()), "matchContains", cfg.MatchContains())
	for _, w := range cfg.Warnings() {
		log.Info("covering-quota rule: "+w, "warning", true)
	}
}

// managerOptions are the manager's options common to every mode: metrics,
// probes, pprof, and leader election for the one mode that elects a leader
// (the others need no Lease, so their identities have none).
func managerOptions(o *Options, scheme *runtime.Scheme, metrics metricsserver.Options) ctrl.Options {
	return ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metrics,
		HealthProbeBindAddress:        o.HealthAddr,
		PprofBindAddress:              o.PprofAddr,
		LeaderElection:                o.LeaderElect && o.Mode == ModeDistributionController,
		LeaderElectionID:              o.LeaderElectID,
		LeaderElectionNamespace:       o.Namespace,
		LeaderElectionReleaseOnCancel: true,
	}
}
