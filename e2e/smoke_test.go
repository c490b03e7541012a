package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/e2e/framework/exampleplugin"
)

// cluster is shared by the tests of this package: starting one takes seconds.
var (
	cluster *framework.Cluster
	node1   *framework.KubeletNode
)

func TestMain(m *testing.M) {
	ctx := context.Background()
	var err error
	cluster, err = framework.Start(ctx, framework.Options{Scheduler: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the cluster:", err)
		os.Exit(1)
	}
	node1, err = cluster.AddKubeletNode(ctx, framework.NodeOptions{Name: "node-1", ExampleDevices: 4})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting node-1:", err, "\n", cluster.Diagnostics())
		_ = cluster.Stop()
		os.Exit(1)
	}
	code := m.Run()
	if err := cluster.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the cluster:", err)
		code = 1
	}
	os.Exit(code)
}

// diagnoseOnFailure prints the components' logs if the test fails.
func diagnoseOnFailure(t *testing.T, c *framework.Cluster) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.Diagnostics())
		}
	})
}

func newNamespace(t *testing.T, ctx context.Context, labels map[string]string) string {
	t.Helper()
	ns, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-", Labels: labels},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

func poll(t *testing.T, ctx context.Context, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestPodGetsDevicesThroughTheKubelet: a pod requesting a device-plugin resource is
// scheduled by the resclass scheduler binary (the cluster's only scheduler), and
// the real kubelet asks the plugin to Allocate and passes its answer to the
// container runtime.
func TestPodGetsDevicesThroughTheKubelet(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	ns := newNamespace(t, ctx, nil)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "with-devices", Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:  "main",
			Image: "registry.example/app:1",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				exampleplugin.ResourceName: resource.MustParse("2"),
			}},
		}}},
	}
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, 60*time.Second, "pod running", func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.Status.Phase == corev1.PodRunning, nil
	})
	p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != node1.Name {
		t.Errorf("pod on %q, want %q", p.Spec.NodeName, node1.Name)
	}
	events, err := cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=Scheduled,involvedObject.name=" + pod.Name})
	if err != nil || len(events.Items) == 0 {
		t.Errorf("no Scheduled event for the pod (err %v)", err)
	}

	rec, err := node1.WaitForRecord(ctx, ns, pod.Name, "main")
	if err != nil {
		t.Fatal(err)
	}
	ids := strings.Split(rec.Env[exampleplugin.EnvDevices], ",")
	if len(ids) != 2 || !strings.HasPrefix(ids[0], "example-") || ids[0] == ids[1] {
		t.Errorf("container env %s = %q, want two distinct example devices", exampleplugin.EnvDevices, rec.Env[exampleplugin.EnvDevices])
	}
	var cdi []string
	for _, d := range rec.CDIDevices {
		cdi = append(cdi, d.GetName())
	}
	slices.Sort(cdi)
	slices.Sort(ids)
	if want := []string{exampleplugin.ResourceName + "=" + ids[0], exampleplugin.ResourceName + "=" + ids[1]}; !slices.Equal(cdi, want) {
		t.Errorf("CDI devices %v, want %v", cdi, want)
	}
}

// TestGarbageCollectionAndNamespaceDeletion: the controller manager really runs.
func TestGarbageCollectionAndNamespaceDeletion(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	ns := newNamespace(t, ctx, nil)
	cms := cluster.Client.CoreV1().ConfigMaps(ns)
	owner, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name:            "dependent",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID}},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cms.Delete(ctx, owner.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, 60*time.Second, "dependent garbage-collected", func(ctx context.Context) (bool, error) {
		_, err := cms.Get(ctx, "dependent", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})

	if err := cluster.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, 60*time.Second, "namespace deleted", func(ctx context.Context) (bool, error) {
		_, err := cluster.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// TestWebhookIsCalled: the apiserver calls an admission webhook over TLS, with a
// serving certificate from the cluster's CA, and enforces its answer.
func TestWebhookIsCalled(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	certFile, keyFile, caBundle, err := cluster.ServingCert("e2e-webhook")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	srv := &http.Server{
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var review admissionv1.AdmissionReview
			if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
				http.Error(w, "bad review", http.StatusBadRequest)
				return
			}
			mu.Lock()
			seen = append(seen, review.Request.Name)
			mu.Unlock()
			resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: review.Request.Name != "deny-me"}
			if !resp.Allowed {
				resp.Result = &metav1.Status{Message: "the e2e webhook denies deny-me"}
			}
			review.Response, review.Request = resp, nil
			_ = json.NewEncoder(w).Encode(review)
		}),
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })

	ns := newNamespace(t, ctx, map[string]string{"e2e-webhook": "on"})
	url := fmt.Sprintf("https://%s/validate", l.Addr())
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "configmaps.e2e.resclass.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caBundle},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"e2e-webhook": "on"}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	created, err := cluster.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, cfg, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
	})

	cms := cluster.Client.CoreV1().ConfigMaps(ns)
	// The apiserver picks up a new webhook configuration within a moment.
	var denial error
	poll(t, ctx, 30*time.Second, "webhook denies deny-me", func(ctx context.Context) (bool, error) {
		_, denial = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "deny-me"}}, metav1.CreateOptions{})
		if denial == nil {
			_ = cms.Delete(ctx, "deny-me", metav1.DeleteOptions{})
		}
		return denial != nil, nil
	})
	if !strings.Contains(denial.Error(), "the e2e webhook denies deny-me") {
		t.Errorf("denial %q does not carry the webhook's message", denial)
	}
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "allow-me"}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("allow-me: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(seen, "deny-me") || !slices.Contains(seen, "allow-me") {
		t.Errorf("webhook saw %v, want deny-me and allow-me", seen)
	}
}

// TestNodeAgentSlot: a node agent runs in its node's mount namespace, with its
// node's name, and sees the kubelet's device-plugin directory.
func TestNodeAgentSlot(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	out := filepath.Join(cluster.Dir, "nodes", "agent-node", "agent-saw")
	_, err := cluster.AddKubeletNode(ctx, framework.NodeOptions{
		Name: "agent-node",
		Agent: []string{"/bin/sh", "-c", `{ echo "$NODE_NAME"; ls "$0"; } > "$1.tmp" && mv "$1.tmp" "$1" && exec sleep 3600`,
			"/var/lib/kubelet/device-plugins", out},
	})
	if err != nil {
		t.Fatal(err)
	}
	var saw []byte
	poll(t, ctx, 10*time.Second, "agent output", func(context.Context) (bool, error) {
		saw, err = os.ReadFile(out)
		return err == nil, nil
	})
	lines := strings.Fields(string(saw))
	if len(lines) < 2 || lines[0] != "agent-node" || !slices.Contains(lines, "kubelet.sock") {
		t.Errorf("the agent saw %q, want its node name and the kubelet's kubelet.sock", lines)
	}
}
