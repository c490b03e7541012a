package framework

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	volumeutil "k8s.io/kubernetes/pkg/volume/util"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/deploy/install"
	deploywebhook "github.com/resclass/resclass/deploy/webhook"
)

// WebhookOptions configure the webhook the cluster runs.
type WebhookOptions struct {
	// Policies turns pod policies on: the Helm chart's webhook.policies
	// values (emptyNamespaceSelector, crossNamespaceAffinityQuota,
	// priorityClassQuota, resourceQuota). The chart renders them, as for an
	// install, and the webhook runs with what it rendered: the pods and
	// workloads webhooks with their matchConditions, the webhook's flags and
	// the covering-quota rule. nil: none, as a default install (no pods or
	// workloads webhook at all).
	Policies map[string]any
	// Component turns the pod policies on as the kustomize component
	// deploy/webhook/policies does, read from its files (no Helm): its
	// webhooks, its flags and its covering-quota rule. deploy/install_test.go
	// keeps it equal to the chart's render of the same three policies.
	// Policies, if also set, wins.
	Component bool
	// QuotaConfig is the covering-quota rule file's content, in place of the
	// one Policies or Component give; nil: theirs, if any.
	QuotaConfig []byte
	// Args are more flags for the binary.
	Args []string
	// Selector, if set, is added to every webhook of the configuration as an
	// objectSelector and a namespaceSelector requirement, so that the
	// webhooks see only the objects of the test that started them.
	Selector map[string]string
}

// The identities of deploy/webhook: the admission webhook's ServiceAccount
// and the cert rotator's.
const (
	WebhookUser     = "system:serviceaccount:resclass-system:resclass-webhook"
	CertRotatorUser = "system:serviceaccount:resclass-system:resclass-webhook-certs"
)

// Webhook is the resclass webhook binary running against the cluster, reached
// by the apiserver over TLS at https://localhost:<port>, with the cert
// rotator beside it (the same binary with --mode=cert-rotator, as its own
// ServiceAccount), which issues the certificate into the TLS Secret and its
// CA into deploy/webhook's configurations. The webhook serves the Secret's
// tls.crt and tls.key from CertDir, written there as the kubelet writes a
// Secret volume (its own atomic writer): the webhook's identity cannot read
// the Secret.
type Webhook struct {
	// Config is the ValidatingWebhookConfiguration as the cluster runs it.
	Config *admissionregistrationv1.ValidatingWebhookConfiguration
	// Mutating is the MutatingWebhookConfiguration (the ResourceDistribution
	// author) as the cluster runs it.
	Mutating *admissionregistrationv1.MutatingWebhookConfiguration
	// QuotaConfigPath is the --quota-config file; rewrite it to change the rule.
	QuotaConfigPath string
	// CertDir is where the webhook serves its certificate from.
	CertDir string
	// Port is the webhook's HTTPS port; MetricsURL its /metrics (plain HTTP).
	Port       int
	MetricsURL string

	proc        *process
	rotator     *process
	args        []string // the webhook's flags, for Restart
	healthPort  int
	stopProject context.CancelFunc
	projected   chan struct{}
	c           *Cluster
	killed      bool
}

// StartWebhook applies deploy/webhook (RBAC of both identities, the TLS
// Secret, the admission policy resclass-spec-author, the webhook
// configurations with a url in place of the Service,
// which the embedded cluster cannot route), starts the cert rotator and the
// webhook binary, each as its ServiceAccount, and projects the Secret into
// the webhook's --cert-dir as the kubelet would. It returns once the webhook
// is ready and the configurations carry the CA. The ResourceDistribution
// controller is not part of it: StartDistribution.
func (c *Cluster) StartWebhook(ctx context.Context, opts WebhookOptions) (*Webhook, error) {
	if _, err := c.ApplyManifestData(ctx, "deploy/webhook/rbac.yaml", append([]byte(resclassNamespace+"\n---\n"), deploywebhook.RBAC...)); err != nil {
		return nil, err
	}
	if _, err := c.ApplyManifestData(ctx, "deploy/webhook/cert-rotator-rbac.yaml", deploywebhook.CertRotatorRBAC); err != nil {
		return nil, err
	}
	// The rotator works under the policy that fences its writes, as installed.
	if _, err := c.ApplyManifestData(ctx, "deploy/webhook/cert-rotator-policy.yaml", deploywebhook.CertRotatorPolicy); err != nil {
		return nil, err
	}
	if _, err := c.ApplyManifestData(ctx, "deploy/webhook/secret.yaml", deploywebhook.Secret); err != nil {
		return nil, err
	}
	// The base installs it with the CRD; here it comes with the webhook,
	// which every test of distributions starts.
	if _, err := c.ApplyManifestData(ctx, "deploy/webhook/author-policy.yaml", deploywebhook.AuthorPolicy); err != nil {
		return nil, err
	}
	saGroups := []string{"system:serviceaccounts", "system:serviceaccounts:resclass-system", "system:authenticated"}
	kubeconfig, err := c.componentKubeconfig("webhook", WebhookUser, saGroups)
	if err != nil {
		return nil, err
	}
	rotatorKubeconfig, err := c.componentKubeconfig("webhook-certs", CertRotatorUser, saGroups)
	if err != nil {
		return nil, err
	}
	port, healthPort, metricsPort, err := freePort3()
	if err != nil {
		return nil, err
	}
	_, rotatorHealthPort, rotatorMetricsPort, err := freePort3()
	if err != nil {
		return nil, err
	}
	w := &Webhook{
		QuotaConfigPath: filepath.Join(c.Dir, "webhook-quota-config.yaml"),
		CertDir:         filepath.Join(c.Dir, "webhook-certs"),
		Port:            port,
		MetricsURL:      fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort),
		c:               c,
	}
	args := []string{"--kubeconfig=" + kubeconfig, "--namespace=resclass-system",
		"--webhook-host=127.0.0.1", "--webhook-port=" + strconv.Itoa(port),
		"--cert-dir=" + w.CertDir,
		"--health-probe-bind-address=127.0.0.1:" + strconv.Itoa(healthPort),
		"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(metricsPort), "--metrics-secure=false",
		"--quota-config-reload-interval=500ms",
		"--v=2",
	}
	var policies renderedPolicies
	switch {
	case opts.Policies != nil:
		if policies, err = renderPolicies(ctx, opts.Policies); err != nil {
			return nil, err
		}
	case opts.Component:
		if policies, err = componentPolicies(); err != nil {
			return nil, err
		}
	}
	args = append(args, policies.args...)
	quotaConfig := opts.QuotaConfig
	if quotaConfig == nil {
		quotaConfig = policies.quotaConfig
	}
	if quotaConfig != nil {
		if err := os.WriteFile(w.QuotaConfigPath, quotaConfig, 0o644); err != nil {
			return nil, err
		}
		args = append(args, "--quota-config="+w.QuotaConfigPath)
	}
	args = append(args, opts.Args...)

	if w.Config, err = webhookConfig(port, opts.Selector, policies.webhooks); err != nil {
		return nil, err
	}
	vwcs := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	_ = vwcs.Delete(ctx, w.Config.Name, metav1.DeleteOptions{})
	if w.Config, err = vwcs.Create(ctx, w.Config, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating the webhook configuration: %w", err)
	}
	if w.Mutating, err = mutatingWebhookConfig(port, opts.Selector); err != nil {
		return nil, err
	}
	mwcs := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	_ = mwcs.Delete(ctx, w.Mutating.Name, metav1.DeleteOptions{})
	if w.Mutating, err = mwcs.Create(ctx, w.Mutating, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating the mutating webhook configuration: %w", err)
	}

	c.progress("starting the resclass cert rotator")
	if w.rotator, err = c.start("webhook-certs", c.bins.webhook, nil, "--mode=cert-rotator",
		"--kubeconfig="+rotatorKubeconfig, "--namespace=resclass-system", "--extra-dns-names=localhost",
		"--health-probe-bind-address=127.0.0.1:"+strconv.Itoa(rotatorHealthPort),
		"--metrics-bind-address=127.0.0.1:"+strconv.Itoa(rotatorMetricsPort), "--metrics-secure=false",
		"--v=2"); err != nil {
		return nil, err
	}
	if err := c.waitReady(ctx, "webhook-certs", rotatorHealthPort); err != nil {
		_ = w.Stop(context.Background())
		return nil, err
	}
	// What the kubelet does for the webhook pod's Secret volume.
	projectCtx, cancel := context.WithCancel(context.Background())
	w.stopProject, w.projected = cancel, make(chan struct{})
	go func() {
		defer close(w.projected)
		c.projectSecret(projectCtx, "resclass-system", "resclass-webhook-tls", w.CertDir, []string{"tls.crt", "tls.key"})
	}()

	c.progress("starting the resclass webhook")
	w.args, w.healthPort = args, healthPort
	if w.proc, err = c.start("webhook", c.bins.webhook, nil, args...); err != nil {
		_ = w.Stop(context.Background())
		return nil, err
	}
	if err := c.waitReady(ctx, "webhook", healthPort); err != nil {
		err = fmt.Errorf("%w\n--- webhook:\n%s\n--- cert rotator:\n%s", err, w.proc.tail(30), w.rotator.tail(30))
		_ = w.Stop(context.Background())
		return nil, err
	}
	// The rotator injects the CA after it issues the certificate.
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := vwcs.Get(ctx, w.Config.Name, metav1.GetOptions{})
		var gotMutating *admissionregistrationv1.MutatingWebhookConfiguration
		if err == nil {
			gotMutating, err = mwcs.Get(ctx, w.Mutating.Name, metav1.GetOptions{})
		}
		if err == nil && len(got.Webhooks) > 0 && len(got.Webhooks[0].ClientConfig.CABundle) > 0 &&
			len(gotMutating.Webhooks) > 0 && len(gotMutating.Webhooks[0].ClientConfig.CABundle) > 0 {
			w.Config, w.Mutating = got, gotMutating
			return w, nil
		}
		if time.Now().After(deadline) {
			_ = w.Stop(context.Background())
			if err == nil {
				err = errors.New("no caBundle")
			}
			return nil, fmt.Errorf("the cert rotator did not inject its CA into %s within 30s: %w\n%s", w.Config.Name, err, w.rotator.tail(40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// renderedPolicies is what the Helm chart renders for webhook.policies: the
// pods and workloads webhooks, the webhook's flags that go with them, and
// the covering-quota rule (nil: none).
type renderedPolicies struct {
	webhooks    []admissionregistrationv1.ValidatingWebhook
	args        []string
	quotaConfig []byte
}

// renderPolicies renders the chart with policies as webhook.policies (the
// helm binary of `make e2e-binaries`) and takes out what the pod policies
// add, so that the tests run what an install with these values runs.
func renderPolicies(ctx context.Context, policies map[string]any) (renderedPolicies, error) {
	var r renderedPolicies
	objs, err := install.HelmTemplate(ctx, map[string]any{"webhook": map[string]any{"policies": policies}})
	if err != nil {
		return r, fmt.Errorf("rendering webhook.policies %v: %w", policies, err)
	}
	for _, o := range objs {
		switch {
		case o.GetKind() == "ValidatingWebhookConfiguration" && o.GetName() == "resclass-webhook":
			var vwc admissionregistrationv1.ValidatingWebhookConfiguration
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &vwc); err != nil {
				return r, err
			}
			for _, wh := range vwc.Webhooks {
				if wh.Name == "pods.resclass.io" || wh.Name == "workloads.resclass.io" {
					r.webhooks = append(r.webhooks, wh)
				}
			}
		case o.GetKind() == "Deployment" && o.GetName() == "resclass-webhook":
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
				return r, err
			}
			for _, a := range d.Spec.Template.Spec.Containers[0].Args {
				if policyArg(a) {
					r.args = append(r.args, a)
				}
			}
		case o.GetKind() == "ConfigMap" && o.GetName() == "resclass-webhook-quota":
			data, _, _ := unstructured.NestedString(o.Object, "data", "quota-config.yaml")
			r.quotaConfig = []byte(data)
		}
	}
	return r, nil
}

// policyArg says whether a is one of the webhook's flags that go with the pod
// policies (the covering-quota rule's path is the harness's own).
func policyArg(a string) bool {
	return a == "--refuse-empty-namespace-selector" || strings.HasPrefix(a, "--match-conditions-cover=")
}

// componentPolicies is what the kustomize component deploy/webhook/policies
// adds, read from its files as kustomize would apply them: the webhooks of
// its JSON patch, the flags its Deployment patch adds, and its
// covering-quota rule.
func componentPolicies() (renderedPolicies, error) {
	var r renderedPolicies
	var webhookOps []struct {
		Op    string                                    `json:"op"`
		Path  string                                    `json:"path"`
		Value admissionregistrationv1.ValidatingWebhook `json:"value"`
	}
	if err := yaml.UnmarshalStrict(deploywebhook.PolicyWebhooks, &webhookOps); err != nil {
		return r, fmt.Errorf("deploy/webhook/policies/webhooks.yaml: %w", err)
	}
	for _, op := range webhookOps {
		if op.Op != "add" || op.Path != "/webhooks/-" {
			return r, fmt.Errorf("deploy/webhook/policies/webhooks.yaml: op %s %s: the harness reads only adds of webhooks", op.Op, op.Path)
		}
		r.webhooks = append(r.webhooks, op.Value)
	}
	var component struct {
		Patches []struct {
			Patch  string `json:"patch"`
			Target struct {
				Kind string `json:"kind"`
			} `json:"target"`
		} `json:"patches"`
	}
	if err := yaml.Unmarshal(deploywebhook.PolicyComponent, &component); err != nil {
		return r, fmt.Errorf("deploy/webhook/policies/kustomization.yaml: %w", err)
	}
	for _, p := range component.Patches {
		if p.Target.Kind != "Deployment" {
			continue
		}
		var ops []struct {
			Path  string `json:"path"`
			Value any    `json:"value"`
		}
		if err := yaml.Unmarshal([]byte(p.Patch), &ops); err != nil {
			return r, fmt.Errorf("deploy/webhook/policies/kustomization.yaml, the Deployment's patch: %w", err)
		}
		for _, op := range ops {
			if a, ok := op.Value.(string); ok && strings.HasPrefix(op.Path, "/spec/template/spec/containers/0/args/") && policyArg(a) {
				r.args = append(r.args, a)
			}
		}
	}
	if len(r.webhooks) == 0 || len(r.args) == 0 {
		return r, errors.New("deploy/webhook/policies: no webhooks or no flags found in the component")
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(deploywebhook.QuotaConfig, &cm); err != nil {
		return r, fmt.Errorf("deploy/webhook/policies/quota-config.yaml: %w", err)
	}
	r.quotaConfig = []byte(cm.Data["quota-config.yaml"])
	return r, nil
}

// webhookConfig is deploy/webhook/webhooks.yaml with the pod policies'
// webhooks added (none: a default install), reached at
// https://localhost:port, narrowed by selector.
func webhookConfig(port int, selector map[string]string, policies []admissionregistrationv1.ValidatingWebhook) (*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := yaml.UnmarshalStrict(deploywebhook.Webhooks, cfg); err != nil {
		return nil, fmt.Errorf("deploy/webhook/webhooks.yaml: %w", err)
	}
	cfg.Webhooks = append(cfg.Webhooks, policies...)
	for i := range cfg.Webhooks {
		wh := &cfg.Webhooks[i]
		url := fmt.Sprintf("https://localhost:%d%s", port, *wh.ClientConfig.Service.Path)
		wh.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url}
		if len(selector) == 0 {
			continue
		}
		wh.ObjectSelector = &metav1.LabelSelector{MatchLabels: selector}
		if wh.NamespaceSelector == nil {
			wh.NamespaceSelector = &metav1.LabelSelector{}
		}
		for k, v := range selector {
			wh.NamespaceSelector.MatchExpressions = append(wh.NamespaceSelector.MatchExpressions,
				metav1.LabelSelectorRequirement{Key: k, Operator: metav1.LabelSelectorOpIn, Values: []string{v}})
		}
	}
	return cfg, nil
}

// mutatingWebhookConfig is deploy/webhook/mutating-webhooks.yaml reached at
// https://localhost:port, narrowed by selector.
func mutatingWebhookConfig(port int, selector map[string]string) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := yaml.UnmarshalStrict(deploywebhook.MutatingWebhooks, cfg); err != nil {
		return nil, fmt.Errorf("deploy/webhook/mutating-webhooks.yaml: %w", err)
	}
	for i := range cfg.Webhooks {
		wh := &cfg.Webhooks[i]
		url := fmt.Sprintf("https://localhost:%d%s", port, *wh.ClientConfig.Service.Path)
		wh.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url}
		if len(selector) > 0 {
			wh.ObjectSelector = &metav1.LabelSelector{MatchLabels: selector}
		}
	}
	return cfg, nil
}

// Kill kills the webhook (SIGKILL) and leaves its configuration in place: the
// apiserver goes on calling a webhook that is not there, as in an outage.
func (w *Webhook) Kill() {
	w.killed = true
	_ = w.proc.cmd.Process.Kill()
	<-w.proc.done
}

// Restart starts the webhook again after Kill, with the same flags, port and
// certificate, as its Deployment's controller brings a replica back; the
// log of the killed one stays beside the new one's. It returns once the new
// one is ready.
func (w *Webhook) Restart(ctx context.Context) error {
	if !w.killed {
		return errors.New("the webhook is running: Kill it first")
	}
	w.c.mu.Lock()
	w.c.processes = slices.DeleteFunc(w.c.processes, func(p *process) bool { return p == w.proc })
	w.c.mu.Unlock()
	_ = os.Rename(w.proc.logPath, fmt.Sprintf("%s.%d", w.proc.logPath, time.Now().UnixNano()))
	proc, err := w.c.start("webhook", w.c.bins.webhook, nil, w.args...)
	if err != nil {
		return err
	}
	w.proc, w.killed = proc, false
	return w.c.waitReady(ctx, "webhook", w.healthPort)
}

// Stop stops the webhook and the cert rotator and removes the
// configurations, so that the apiserver stops calling the webhook.
func (w *Webhook) Stop(ctx context.Context) error {
	var errDelete error
	if w.Config != nil && w.Mutating != nil {
		errDelete = errors.Join(
			w.c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, w.Config.Name, metav1.DeleteOptions{}),
			w.c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, w.Mutating.Name, metav1.DeleteOptions{}))
	}
	var errStop error
	if w.proc != nil && !w.killed {
		errStop = w.proc.stop(10 * time.Second)
	}
	if w.rotator != nil {
		errStop = errors.Join(errStop, w.rotator.stop(10*time.Second))
	}
	if w.stopProject != nil {
		w.stopProject()
		<-w.projected
	}
	w.c.mu.Lock()
	w.c.processes = slices.DeleteFunc(w.c.processes, func(p *process) bool { return p == w.proc || p == w.rotator })
	w.c.mu.Unlock()
	if errStop != nil {
		return errStop
	}
	return errDelete
}

// RotatorLog is the cert rotator's log so far.
func (w *Webhook) RotatorLog() string {
	data, _ := os.ReadFile(w.rotator.logPath)
	return string(data)
}

// projectSecret keeps dir holding the keys of the Secret namespace/name, as
// the kubelet keeps a Secret volume with items: with the kubelet's own
// atomic writer (a timestamped directory behind the ..data symlink, swapped
// in one rename), so the webhook sees the very file operations it sees in a
// pod. The kubelet refreshes a volume about once a minute; this watches the
// one Secret, so a renewal reaches the webhook within a second at no
// apiserver cost while nothing changes. It reads the Secret as the cluster's
// admin: the kubelet's identity, not the webhook's. It runs until ctx is done.
func (c *Cluster) projectSecret(ctx context.Context, namespace, name, dir string, keys []string) {
	// The kubelet creates the mount point before it writes the volume.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		c.progress("projecting Secret %s/%s: %v", namespace, name, err)
		return
	}
	writer, err := volumeutil.NewAtomicWriter(dir, "e2e secret volume "+namespace+"/"+name)
	if err != nil {
		c.progress("projecting Secret %s/%s: %v", namespace, name, err)
		return
	}
	project := func(obj any) {
		s, ok := obj.(*corev1.Secret)
		if !ok {
			return
		}
		payload := map[string]volumeutil.FileProjection{}
		for _, k := range keys {
			// optional: true, as deploy/webhook mounts it: a key not there
			// yet is left out.
			if v, ok := s.Data[k]; ok {
				payload[k] = volumeutil.FileProjection{Data: v, Mode: 0o440}
			}
		}
		if err := writer.Write(payload, nil); err != nil {
			c.progress("projecting Secret %s/%s: %v", namespace, name, err)
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	// One handler goroutine: the writes never overlap.
	if _, err := factory.Core().V1().Secrets().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    project,
		UpdateFunc: func(_, obj any) { project(obj) },
	}); err != nil {
		c.progress("projecting Secret %s/%s: %v", namespace, name, err)
		return
	}
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
}

// PID is the webhook process's id.
func (w *Webhook) PID() int { return w.proc.cmd.Process.Pid }

// Log is the webhook's log so far.
func (w *Webhook) Log() string {
	data, _ := os.ReadFile(w.proc.logPath)
	return string(data)
}

// Metric returns the value of the first sample on /metrics whose line starts
// with prefix (a name with its labels, e.g. `resclass_webhook_denials_total{reason="x"`
// — label order as the server prints them), or 0 if there is none.
func (w *Webhook) Metric(ctx context.Context, prefix string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.MetricsURL, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return 0, err
	}
	for _, line := range strings.Split(buf.String(), "\n") {
		if strings.HasPrefix(line, prefix) {
			fields := strings.Fields(line)
			return strconv.ParseFloat(fields[len(fields)-1], 64)
		}
	}
	return 0, nil
}

// ServedCertificate dials the webhook and returns the leaf certificate it
// serves now, e.g. to see a rotation take effect.
func (w *Webhook) ServedCertificate() ([]byte, error) {
	conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", w.Port), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reads the certificate, trusts nothing
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	return conn.ConnectionState().PeerCertificates[0].Raw, nil
}

// waitReady waits for a component's /readyz on plain HTTP, and gives up
// early if the component exits.
func (c *Cluster) waitReady(ctx context.Context, name string, port int) error {
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", port)
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := c.alive(name); err != nil {
			return false, err
		}
		last = waitHTTP(ctx, url, nil, 0)
		return last == nil, nil
	})
	if err != nil {
		if last != nil {
			return fmt.Errorf("%s not ready: %w (last: %w)", name, err, last)
		}
		return fmt.Errorf("%s not ready: %w", name, err)
	}
	c.progress("%s ready", name)
	return nil
}
