package readiness

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/spf13/cobra"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// /readyz is ready only when every registered check passes and
// kube-scheduler's own /readyz is ready.
func TestReadyz(t *testing.T) {
	var ownReady, cacheReady atomic.Bool
	own := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" || !ownReady.Load() {
			http.Error(w, "[-]sched-handler-sync failed", http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer own.Close()
	defer Register("device-cache", func() error {
		if !cacheReady.Load() {
			return errors.New("the device cache is not synced: NodeDevices not listed yet")
		}
		return nil
	})()
	srv, err := Serve("127.0.0.1:0", own.URL+"/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	url := "http://" + srv.Addr + "/readyz"

	for _, tc := range []struct {
		name       string
		own, cache bool
		code       int
		says       string
	}{
		{name: "device cache not synced", own: true, code: http.StatusServiceUnavailable, says: "device-cache: the device cache is not synced: NodeDevices"},
		{name: "kube-scheduler not ready", cache: true, code: http.StatusServiceUnavailable, says: "kube-scheduler's /readyz: 500 [-]sched-handler-sync failed"},
		{name: "both ready", own: true, cache: true, code: http.StatusOK, says: "ok"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ownReady.Store(tc.own)
			cacheReady.Store(tc.cache)
			code, body := get(t, url)
			if code != tc.code || !strings.Contains(body, tc.says) {
				t.Errorf("/readyz = %d %q, want %d saying %q", code, body, tc.code, tc.says)
			}
		})
	}
}

// Command wraps kube-scheduler's command: with the flag set, /readyz is
// served while the command runs and asks kube-scheduler's own on
// --secure-port.
func TestCommand(t *testing.T) {
	own := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "[-]sched-handler-sync failed", http.StatusInternalServerError)
	}))
	defer own.Close()
	_, ownPort, _ := strings.Cut(strings.TrimPrefix(own.URL, "https://"), ":")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	address := ln.Addr().String()
	_ = ln.Close()

	var code int
	var body string
	cmd := &cobra.Command{Use: "kube-scheduler", RunE: func(*cobra.Command, []string) error {
		code, body = get(t, "http://"+address+"/readyz")
		return nil
	}}
	cmd.Flags().Int("secure-port", 10259, "")
	cmd.Flags().String("bind-address", "0.0.0.0", "")
	Command(cmd)
	cmd.SetArgs([]string{"--secure-port=" + ownPort, "--" + FlagName + "=" + address})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "kube-scheduler's /readyz: 500") {
		t.Errorf("/readyz while kube-scheduler's is not ready: %d %q", code, body)
	}
}
