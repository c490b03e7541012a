package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/resclass/resclass/pkg/servingcert"
)

// The files of a serving certificate in --cert-dir: kubernetes.io/tls's
// Secret keys, which the rotator and cert-manager both write, projected by
// the kubelet from the mounted Secret.
const (
	certFile = corev1.TLSCertKey       // tls.crt
	keyFile  = corev1.TLSPrivateKeyKey // tls.key
)

var (
	certRotations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "resclass_webhook_cert_rotations_total",
		Help: "Certificates the cert rotator issued into the webhook's TLS Secret, by what: ca (a new CA and serving certificate) or serving (a new serving certificate from the same CA).",
	}, []string{"what"})
	certNotAfter = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "resclass_webhook_serving_cert_not_after_timestamp_seconds",
		Help: "When the serving certificate in the webhook's TLS Secret expires (Unix seconds), as the cert rotator last read it.",
	})
)

func init() { ctrlmetrics.Registry.MustRegister(certRotations, certNotAfter) }

// certRotator keeps the webhook's TLS Secret holding a CA and a serving
// certificate that are valid and not about to expire, and the two webhook
// configurations' caBundle holding that CA (and the previous one while it is
// valid). It reads and writes the one Secret and the two configurations by
// name: its cache watches each through a metadata.name field selector, which
// RBAC authorizes by resourceNames, so its identity needs no other Secret.
//
// Replicas need no leader: every write is an update at the resourceVersion
// read, so two rotators that renew at once conflict, and the loser reads the
// winner's certificate, finds it current and writes nothing.
type certRotator struct {
	client   client.Client
	recorder events.EventRecorder
	issuer   *servingcert.Issuer
	secret   types.NamespacedName
	// Names of the ValidatingWebhookConfiguration and the
	// MutatingWebhookConfiguration whose caBundle it keeps.
	validating, mutating string
	now                  func() time.Time
}

// Reconcile renews what needs renewing, then injects the bundle. Every event
// (the Secret, either configuration) comes here under one key.
func (r *certRotator) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	var secret corev1.Secret
	if err := r.client.Get(ctx, r.secret, &secret); apierrors.IsNotFound(err) {
		// Creating a Secret is a verb this identity does not have.
		log.Info("the TLS Secret does not exist; create it (deploy/webhook/secret.yaml): the rotator fills it but may not create it", "secret", r.secret.String())
		return reconcile.Result{RequeueAfter: 30 * time.Second}, nil
	} else if err != nil {
		return reconcile.Result{}, err
	}
	now := r.now()
	data, renewal, err := r.issuer.Ensure(secret.Data, now)
	if err != nil {
		return reconcile.Result{}, err
	}
	if data != nil {
		updated := secret.DeepCopy()
		updated.Data = data
		if err := r.client.Update(ctx, updated); err != nil {
			// A conflict: another rotator (or an admin) wrote it; the watch
			// brings the new version back here.
			return reconcile.Result{}, err
		}
		secret = *updated
		what := ""
		switch {
		case renewal.CA:
			what = "ca"
			r.recorder.Eventf(&secret, nil, corev1.EventTypeNormal, "IssuedCA", "Rotate",
				"issued a new CA and serving certificate (valid until %s): %s", servingcert.NotAfter(data).UTC().Format(time.RFC3339), renewal.Reason)
		case renewal.Cert:
			what = "serving"
			r.recorder.Eventf(&secret, nil, corev1.EventTypeNormal, "IssuedCertificate", "Rotate",
				"issued a new serving certificate (valid until %s): %s", servingcert.NotAfter(data).UTC().Format(time.RFC3339), renewal.Reason)
		}
		if what != "" {
			certRotations.WithLabelValues(what).Inc()
		}
		log.Info("TLS Secret updated", "secret", r.secret.String(), "newCA", renewal.CA, "newCertificate", renewal.Cert, "reason", renewal.Reason)
	}
	certNotAfter.Set(float64(servingcert.NotAfter(secret.Data).Unix()))

	bundle := servingcert.Bundle(secret.Data, now)
	if len(bundle) == 0 {
		return reconcile.Result{}, errors.New("the TLS Secret holds no valid CA after renewal")
	}
	if err := r.inject(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{}, r.validating, bundle); err != nil {
		return reconcile.Result{}, err
	}
	if err := r.inject(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{}, r.mutating, bundle); err != nil {
		return reconcile.Result{}, err
	}
	// Back when the next certificate is due, and at least hourly (the watches
	// bring every change sooner).
	next := r.issuer.NextCheck(secret.Data).Sub(now)
	if next <= 0 || next > time.Hour {
		next = time.Hour
	}
	return reconcile.Result{RequeueAfter: next}, nil
}

// inject sets every webhook's caBundle in the named configuration to bundle,
// writing only when one differs (someone re-applied the manifest, or a new
// CA).
func (r *certRotator) inject(ctx context.Context, obj client.Object, name string, bundle []byte) error {
	if err := r.client.Get(ctx, types.NamespacedName{Name: name}, obj); apierrors.IsNotFound(err) {
		ctrl.LoggerFrom(ctx).Info("webhook configuration not found: nothing to inject the CA into", "kind", fmt.Sprintf("%T", obj), "name", name)
		return nil
	} else if err != nil {
		return err
	}
	changed := false
	set := func(cc *admissionregistrationv1.WebhookClientConfig) {
		if !bytes.Equal(cc.CABundle, bundle) {
			cc.CABundle, changed = bundle, true
		}
	}
	switch c := obj.(type) {
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		for i := range c.Webhooks {
			set(&c.Webhooks[i].ClientConfig)
		}
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		for i := range c.Webhooks {
			set(&c.Webhooks[i].ClientConfig)
		}
	}
	if !changed {
		return nil
	}
	if err := r.client.Update(ctx, obj, client.FieldOwner("resclass-cert-rotator")); err != nil {
		return err
	}
	ctrl.LoggerFrom(ctx).Info("caBundle injected", "kind", fmt.Sprintf("%T", obj), "name", name)
	return nil
}

// runCertRotator runs --mode=cert-rotator until ctx is done.
func runCertRotator(ctx context.Context, o *Options, cfg *rest.Config, scheme *runtime.Scheme, metrics metricsserver.Options) error {
	log := ctrl.Log.WithName("cert-rotator")
	byName := func(name string) fields.Selector { return fields.OneTermEqualSelector("metadata.name", name) }
	opts := managerOptions(o, scheme, metrics)
	opts.Cache = cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Secret{}: {Namespaces: map[string]cache.Config{o.Namespace: {}}, Field: byName(o.TLSSecret)},
		&admissionregistrationv1.ValidatingWebhookConfiguration{}: {Field: byName(o.WebhookConfigName)},
		&admissionregistrationv1.MutatingWebhookConfiguration{}:   {Field: byName(o.MutatingWebhookConfigName)},
	}}
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		return err
	}
	dnsName := fmt.Sprintf("%s.%s.svc", o.ServiceName, o.Namespace)
	r := &certRotator{
		client:   mgr.GetClient(),
		recorder: mgr.GetEventRecorder("resclass-cert-rotator"),
		issuer: &servingcert.Issuer{
			CAName:       "resclass-webhook-ca",
			Organization: "resclass",
			DNSNames:     append([]string{dnsName, dnsName + ".cluster.local"}, o.ExtraDNSNames...),
			CertValidity: o.CertValidity,
			RenewBefore:  o.CertRenewBefore,
		},
		secret:     types.NamespacedName{Namespace: o.Namespace, Name: o.TLSSecret},
		validating: o.WebhookConfigName,
		mutating:   o.MutatingWebhookConfigName,
		now:        time.Now,
	}
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: r.secret}}
	})
	if err := ctrl.NewControllerManagedBy(mgr).
		Named("cert-rotator").
		WatchesRawSource(source.Kind[client.Object](mgr.GetCache(), &corev1.Secret{}, one)).
		WatchesRawSource(source.Kind[client.Object](mgr.GetCache(), &admissionregistrationv1.ValidatingWebhookConfiguration{}, one)).
		WatchesRawSource(source.Kind[client.Object](mgr.GetCache(), &admissionregistrationv1.MutatingWebhookConfiguration{}, one)).
		Complete(r); err != nil {
		return err
	}
	// The first reconcile also comes without an event: a missing Secret is
	// reported, and retried, even though no watch fires for it.
	if err := mgr.Add(everyReplica{manager.RunnableFunc(func(ctx context.Context) error {
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return nil
		}
		_, err := r.Reconcile(ctrl.LoggerInto(ctx, log), reconcile.Request{NamespacedName: r.secret})
		// A conflict is the controller's own first reconcile having written
		// first: its certificate stands.
		if err != nil && !apierrors.IsConflict(err) {
			log.Error(err, "first check of the TLS Secret failed; retried on the next event or within the hour")
		}
		return nil
	})}); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("cache", func(req *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(req.Context()) {
			return errors.New("the cache has not synced")
		}
		return nil
	}); err != nil {
		return err
	}
	log.Info("starting the cert rotator", "secret", r.secret.String(), "dnsNames", r.issuer.DNSNames,
		"validatingWebhookConfiguration", r.validating, "mutatingWebhookConfiguration", r.mutating)
	return mgr.Start(ctx)
}

// certsPresent reports whether the certificate directory holds a key pair the
// server can load.
func certsPresent(dir string) bool {
	for _, f := range []string{certFile, keyFile} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			return false
		}
	}
	return true
}
