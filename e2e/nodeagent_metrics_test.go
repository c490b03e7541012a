package e2e

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/resclass/resclass/pkg/nodeagent"
)

// TestNodeAgentMetricsNeedAuthorization runs the node-agent command as the
// DaemonSet does (--metrics-secure by default) and checks issue 19's
// failure 8 against the real apiserver: /metrics, the node's inventory and
// health, answers no anonymous caller (401) and no ServiceAccount without the
// resclass-node-agent-metrics-reader role (403), and answers one bound to it;
// the probe paths stay open.
func TestNodeAgentMetricsNeedAuthorization(t *testing.T) {
	ctx, cancel := agentTest(t, 2*time.Minute)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	address := ln.Addr().String()
	_ = ln.Close()

	actx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		cmd := nodeagent.NewCommand()
		cmd.SetArgs([]string{"--kubeconfig", cluster.Kubeconfig, "--node-name", "metrics-node-absent",
			"--metrics-bind-address", address, "--device-plugin-dir", "", "--introspection-socket", "", "--nvml-library", "/nonexistent/libnvidia-ml.so.1"})
		cmd.SetOut(io.Discard)
		done <- cmd.ExecuteContext(actx)
	}()
	defer func() { stop(); <-done }()

	// The agent's certificate is self-signed: a scraper skips verification
	// and authenticates itself with its token.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed by design
	get := func(path, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+address+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(body)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		code, _ := get("/healthz", "")
		return code == http.StatusOK, nil
	}); err != nil {
		t.Fatalf("/healthz over HTTPS without a token never answered 200: %v", err)
	}

	if code, body := get("/metrics", ""); code != http.StatusUnauthorized {
		t.Errorf("anonymous /metrics: %d %q, want 401", code, body)
	}

	// Two scrapers: one without the role, one bound to it. (Not one bound
	// later: the agent caches a denial for 10 s.)
	ns := newNamespace(t, ctx, nil)
	token := func(name string) string {
		t.Helper()
		if _, err := cluster.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := cluster.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	stranger, scraper := token("stranger"), token("scraper")
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-metrics-scraper-" + ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "resclass-node-agent-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "scraper"}},
	}
	if _, err := cluster.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	// RBAC takes effect when the apiserver's informer sees the binding.
	var code int
	var body string
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		code, body = get("/metrics", scraper)
		return code == http.StatusOK, nil
	})
	if code != http.StatusOK || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics for the bound scraper: %d, want 200 with the agent's metrics:\n%.300s", code, body)
	}
	if code, body := get("/metrics", stranger); code != http.StatusForbidden {
		t.Errorf("/metrics for a ServiceAccount without the role: %d %q, want 403", code, body)
	}
	if code, _ := get("/readyz", ""); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz without a token before the first publish: %d, want 503 (open, not ready)", code)
	}
}
