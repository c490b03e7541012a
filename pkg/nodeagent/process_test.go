package nodeagent

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/cli"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind/hugepages"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
)

// These tests run node-agent as cmd/node-agent does, in a process of its own
// (this test binary again, with the arguments in an environment variable):
// what they check, a crash or a signal, would end the test process.
const helperArgs = "RESCLASS_NODE_AGENT_ARGS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(helperArgs); ok {
		var argv []string
		if err := json.Unmarshal([]byte(args), &argv); err != nil {
			panic(err)
		}
		cmd := NewCommand()
		cmd.SetArgs(argv)
		os.Exit(cli.Run(cmd))
	}
	os.Exit(m.Run())
}

// agentProcess starts node-agent with args.
func agentProcess(t *testing.T, args ...string) (*exec.Cmd, io.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	argv, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), helperArgs+"="+string(argv))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	return cmd, stderr
}

// A --nvml-library that loads but is not NVML used to end the process
// ("symbol lookup error: undefined symbol: nvmlInit"), taking the NICs and
// hugepages with it. It is the NVMLAvailable condition now.
func TestWrongLibraryIsACondition(t *testing.T) {
	var path string
	for _, p := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6", "/lib64/libc.so.6"} {
		if _, err := os.Stat(p); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Fatalf("no libc.so.6 on this %s machine", runtime.GOARCH)
	}
	cmd, stderr := agentProcess(t, "discover", "--nvml-library", path, "--host-root", t.TempDir(), "-o", "json")
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	errOut, _ := io.ReadAll(stderr)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("node-agent discover --nvml-library %s: %v\n%s", path, err, errOut)
	}
	var status v1alpha1.NodeDevicesStatus
	if err := json.Unmarshal([]byte(out.String()), &status); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	c := meta.FindStatusCondition(status.Conditions, nvidiagpu.Condition)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "WrongLibrary" || !strings.Contains(c.Message, "lacks nvmlInit_v2") {
		t.Errorf("NVMLAvailable = %+v, want False/WrongLibrary naming the missing symbol", c)
	}
	if c := meta.FindStatusCondition(status.Conditions, hugepages.Condition); c == nil {
		t.Errorf("no %s condition: the other sources did not report", hugepages.Condition)
	}
}

// An apiserver that cannot be reached at start used to end the agent ("connection
// refused" → exit 1), and SIGTERM killed it where it stood. Now it waits for the
// apiserver with backoff, and SIGTERM ends it with status 0.
func TestUnreachableAPIServerThenSIGTERM(t *testing.T) {
	dir := t.TempDir()
	// Port 1 on localhost: connection refused.
	kubeconfig := writeKubeconfig(t, dir, "https://127.0.0.1:1")
	cmd, stderr := agentProcess(t, "--node-name=n1", "--kubeconfig="+kubeconfig, "--metrics-bind-address=127.0.0.1:0",
		"--device-plugin-dir=", "--introspection-socket=", "--nvml-library=/nonexistent/libnvidia-ml.so.1", "--host-root="+dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Three refusals in a row (at 0, 0.5 s and 1.5 s): the agent waits.
	lines := bufio.NewScanner(stderr)
	var log []string
	refused := 0
	for refused < 3 && lines.Scan() {
		log = append(log, lines.Text())
		if strings.Contains(lines.Text(), "waiting for the apiserver") && strings.Contains(lines.Text(), "connection refused") {
			refused++
		}
	}
	if refused < 3 {
		err := cmd.Wait()
		t.Fatalf("the agent stopped waiting for the apiserver (%v):\n%s", err, strings.Join(log, "\n"))
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	terminate(t, cmd)
}

// The Node is not registered yet (the apiserver answers 404, as it does before
// the kubelet registers): the agent waits, and SIGTERM used to kill it there.
func TestSIGTERMExitsZero(t *testing.T) {
	apiserver := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
	}))
	defer apiserver.Close()
	dir := t.TempDir()
	kubeconfig := writeKubeconfig(t, dir, apiserver.URL)
	cmd, stderr := agentProcess(t, "--node-name=n1", "--kubeconfig="+kubeconfig, "--metrics-bind-address=127.0.0.1:0",
		"--device-plugin-dir=", "--introspection-socket=", "--nvml-library=/nonexistent/libnvidia-ml.so.1", "--host-root="+dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stderr)
	var log []string
	for lines.Scan() {
		log = append(log, lines.Text())
		if strings.Contains(lines.Text(), "waiting for the Node to be registered") {
			break
		}
	}
	if len(log) == 0 || !strings.Contains(log[len(log)-1], "waiting for the Node") {
		err := cmd.Wait()
		t.Fatalf("the agent did not wait for its Node (%v):\n%s", err, strings.Join(log, "\n"))
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	terminate(t, cmd)
}

// terminate sends SIGTERM and wants exit status 0.
func terminate(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("after SIGTERM: %v (signaled: %v), want exit status 0", err, exit.Sys().(syscall.WaitStatus).Signaled())
		} else if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the agent did not exit within 30s of SIGTERM")
	}
}

func writeKubeconfig(t *testing.T, dir, server string) string {
	t.Helper()
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+server+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
