// Package readiness gives the resclass scheduler a readiness endpoint that
// knows what kube-scheduler's own /readyz cannot be told: kube-scheduler's
// app builds its health checks from a fixed list, with no way for a plugin
// to add one. So the binary serves /readyz on --resclass-readiness-bind-address
// too: ready when every check registered here passes (the ResourceClasses
// plugin's device cache has synced) and kube-scheduler's own /readyz, asked
// on its --secure-port (over loopback unless --bind-address names one
// address), is ready. Liveness stays kube-scheduler's /healthz: what these
// checks report (a CRD missing, RBAC that does not allow a list) is not
// fixed by a restart.
package readiness

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

var (
	mu     sync.Mutex
	checks = map[string]func() error{}
)

// Register adds a named check to the endpoint; the returned func removes it.
func Register(name string, check func() error) (unregister func()) {
	mu.Lock()
	defer mu.Unlock()
	checks[name] = check
	return func() {
		mu.Lock()
		defer mu.Unlock()
		delete(checks, name)
	}
}

// Check runs the registered checks, in name order, and joins their errors.
func Check() error {
	mu.Lock()
	registered := maps.Clone(checks)
	mu.Unlock()
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(registered)) {
		if err := registered[name](); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// FlagName is the flag Command adds.
const FlagName = "resclass-readiness-bind-address"

// askTimeout bounds the question to kube-scheduler's own /readyz, below the
// probe's timeoutSeconds.
const askTimeout = 3 * time.Second

// Command adds --resclass-readiness-bind-address to kube-scheduler's command
// and, when it is set, serves /readyz there while the command runs.
func Command(cmd *cobra.Command) *cobra.Command {
	var address string
	cmd.Flags().StringVar(&address, FlagName, "", "address (host:port) of a plain-HTTP /readyz that is ready when kube-scheduler's own /readyz is (asked on --secure-port, over loopback unless --bind-address names one address) and the ResourceClasses plugin's device cache has synced: a NodeDevices or ResourceClass CRD missing, or RBAC that does not let the scheduler list them, keeps it unready (and logged) where kube-scheduler's /readyz and /healthz stay green; point the readiness probe here, the liveness probe at /healthz; \"\" serves none")
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if address != "" {
			own := ""
			if f := c.Flags().Lookup("secure-port"); f != nil && f.Value.String() != "0" {
				own = "https://" + net.JoinHostPort(ownHost(c), f.Value.String()) + "/readyz"
			}
			srv, err := Serve(address, own)
			if err != nil {
				return err
			}
			defer func() { _ = srv.Close() }()
			klog.Background().Info("serving readiness", "address", srv.Addr, FlagName, address)
		}
		return run(c, args)
	}
	return cmd
}

// ownHost is where kube-scheduler's secure port answers this process:
// loopback, unless --bind-address names one address only.
func ownHost(c *cobra.Command) string {
	if f := c.Flags().Lookup("bind-address"); f != nil {
		if ip := net.ParseIP(f.Value.String()); ip != nil && !ip.IsUnspecified() {
			return ip.String()
		}
	}
	return "127.0.0.1"
}

// Serve serves /readyz on address: the registered checks, then, if own is
// set, kube-scheduler's own /readyz at that URL.
func Serve(address, own string) (*http.Server, error) {
	ln, err := net.Listen("tcp", address)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", FlagName, err)
	}
	// kube-scheduler's serving certificate is its own, self-signed unless
	// configured: the question goes over loopback to this very process, and
	// /readyz carries no secret.
	client := &http.Client{Timeout: askTimeout, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}} //nolint:gosec // loopback to this process
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		err := Check()
		if err == nil && own != "" {
			err = ask(r.Context(), client, own)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	srv := &http.Server{Addr: ln.Addr().String(), Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.Background().Error(err, "readiness endpoint stopped")
		}
	}()
	return srv, nil
}

func ask(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("kube-scheduler's /readyz: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("kube-scheduler's /readyz: %d %s", resp.StatusCode, body)
	}
	return nil
}
