// Package maintest checks what only a binary's main wires: its blank imports
// (log formats, metrics) and its flags. main runs in a child process of the
// test, the test binary run again, as the binary itself would run.
package maintest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const envArgs = "RESCLASS_MAINTEST_ARGS"

// WantJSONLog runs main with args in a child process and wants it to fail
// with its error as a JSON log line ({"msg":"command failed","err":...}),
// which cli.Run writes once logging is set up. Call it from a test of the
// main package: in the child it runs main instead of the test.
func WantJSONLog(t *testing.T, main func(), args ...string) {
	if v, ok := os.LookupEnv(envArgs); ok {
		var a []string
		if err := json.Unmarshal([]byte(v), &a); err != nil {
			panic(err)
		}
		os.Args = append([]string{os.Args[0]}, a...)
		main()
		os.Exit(0)
	}
	encoded, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$")
	cmd.Env = append(os.Environ(), envArgs+"="+string(encoded))
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("%v exited 0, want a failure:\n%s", args, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		var entry struct{ Msg, Err string }
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "command failed" && entry.Err != "" {
			return
		}
	}
	t.Errorf("%v: no JSON log line {\"msg\":\"command failed\",\"err\":...} in:\n%s", args, out)
}

// WantMetrics makes one client-go request (request metrics appear once a
// request was made), then wants every name among what g gathers.
func WantMetrics(t *testing.T, g prometheus.Gatherer, names ...string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"major":"1","minor":"36"}`))
	}))
	defer srv.Close()
	c, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Discovery().ServerVersion(); err != nil {
		t.Fatal(err)
	}
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range families {
		got[f.GetName()] = true
	}
	for _, n := range names {
		if !got[n] {
			t.Errorf("no metric %s", n)
		}
	}
}
