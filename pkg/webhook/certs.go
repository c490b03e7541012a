package webhook

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// The Secret keys of a serving certificate: kubernetes.io/tls's, which both
// cert-controller and cert-manager write.
const (
	certFile = corev1.TLSCertKey       // tls.crt
	keyFile  = corev1.TLSPrivateKeyKey // tls.key
)

// addCertRotator has cert-controller keep a self-signed CA and serving
// certificate in the TLS Secret and the CA in the webhook configuration's
// caBundle, rotating both before they expire. With leader election only the
// leader rotates; every replica serves what is in the Secret.
func addCertRotator(mgr manager.Manager, o *Options) error {
	dnsName := fmt.Sprintf("%s.%s.svc", o.ServiceName, o.Namespace)
	return rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey:      types.NamespacedName{Namespace: o.Namespace, Name: o.TLSSecret},
		CertDir:        o.CertDir,
		CAName:         "resclass-webhook-ca",
		CAOrganization: "resclass",
		DNSName:        dnsName,
		ExtraDNSNames:  append([]string{dnsName + ".cluster.local"}, o.ExtraDNSNames...),
		IsReady:        make(chan struct{}),
		Webhooks: []rotator.WebhookInfo{
			{Name: o.WebhookConfigName, Type: rotator.Validating},
			{Name: o.MutatingWebhookConfigName, Type: rotator.Mutating},
		},
		FieldOwner: "resclass-webhook",
		// Rotation happens in the leader; the others see the Secret change.
		RequireLeaderElection: o.LeaderElect,
		EnableReadinessCheck:  true,
	})
}

// secretFiles copies the serving certificate from the TLS Secret into the
// certificate directory whenever the Secret changes. The webhook server
// reloads the files (controller-runtime's certwatcher), so a rotation takes
// effect in seconds, without a restart and without waiting for the kubelet to
// refresh a mounted Secret.
type secretFiles struct {
	client client.Reader
	key    types.NamespacedName
	dir    string
}

func addSecretFiles(mgr manager.Manager, o *Options) error {
	// A cache of its own that holds the one Secret (RBAC grants it by name).
	tlsCache, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{&corev1.Secret{}: {
			Namespaces: map[string]cache.Config{o.Namespace: {}},
			Field:      fields.OneTermEqualSelector("metadata.name", o.TLSSecret),
		}},
	})
	if err != nil {
		return err
	}
	if err := mgr.Add(everyReplica{tlsCache}); err != nil {
		return err
	}
	s := &secretFiles{client: tlsCache, key: types.NamespacedName{Namespace: o.Namespace, Name: o.TLSSecret}, dir: o.CertDir}
	return ctrl.NewControllerManagedBy(mgr).
		Named("serving-cert-files").
		WatchesRawSource(source.Kind(tlsCache, &corev1.Secret{}, &handler.TypedEnqueueRequestForObject[*corev1.Secret]{})).
		// Every replica serves, so every replica copies.
		WithOptions(controller.Options{NeedLeaderElection: ptr.To(false)}).
		Complete(s)
}

func (s *secretFiles) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if req.NamespacedName != s.key {
		return reconcile.Result{}, nil
	}
	log := ctrl.LoggerFrom(ctx)
	var secret corev1.Secret
	if err := s.client.Get(ctx, s.key, &secret); apierrors.IsNotFound(err) {
		log.Info("the TLS Secret does not exist yet; the webhook serves once it holds a certificate")
		return reconcile.Result{}, nil
	} else if err != nil {
		return reconcile.Result{}, err
	}
	cert, key := secret.Data[certFile], secret.Data[keyFile]
	if len(cert) == 0 || len(key) == 0 {
		// cert-controller or cert-manager has not issued yet.
		return reconcile.Result{RequeueAfter: 5 * time.Second}, nil
	}
	// The key first: the server reloads when either file changes, and a new
	// certificate next to the old key would not load.
	changedKey, err := writeIfChanged(filepath.Join(s.dir, keyFile), key, 0o600)
	if err != nil {
		return reconcile.Result{}, err
	}
	changedCert, err := writeIfChanged(filepath.Join(s.dir, certFile), cert, 0o644)
	if err != nil {
		return reconcile.Result{}, err
	}
	if changedKey || changedCert {
		log.Info("serving certificate updated from the Secret", "secret", s.key.String(), "dir", s.dir)
	}
	return reconcile.Result{}, nil
}

// writeIfChanged replaces path with data atomically (a rename), so a reader
// never sees half a file. It reports whether the content changed.
func writeIfChanged(path string, data []byte, mode os.FileMode) (bool, error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return false, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return false, err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // gone after the rename; removes a failed write
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return false, err
	}
	if err := tmp.Chmod(mode); err != nil {
		_ = tmp.Close()
		return false, err
	}
	if err := tmp.Close(); err != nil {
		return false, err
	}
	return true, os.Rename(tmp.Name(), path)
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
