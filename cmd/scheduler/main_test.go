package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"sigs.k8s.io/yaml"

	deployscheduler "github.com/resclass/resclass/deploy/scheduler"
	"github.com/resclass/resclass/internal/maintest"
	"github.com/resclass/resclass/pkg/scheduler/nodefit"
	"github.com/resclass/resclass/pkg/scheduler/resourceclasses"
)

// The binary logs as --logging-format says: a failing start is one JSON line.
func TestLoggingFormatJSON(t *testing.T) {
	maintest.WantJSONLog(t, main, "--logging-format=json", "--config=/nonexistent/config.yaml")
}

// /metrics carries what upstream kube-scheduler's carries besides the
// scheduler's own: client-go's request metrics and the build info.
func TestStandardMetrics(t *testing.T) {
	maintest.WantMetrics(t, legacyregistry.DefaultGatherer, "kubernetes_build_info", "rest_client_requests_total")
}

// The shipped configuration loads as kube-scheduler loads it, with this
// binary's plugins, and its profile runs NodeResourcesFitWithoutClasses in
// NodeResourcesFit's place at every extension point NodeResourcesFit has.
func TestShippedConfigReplacesNodeResourcesFit(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(deployscheduler.Config, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["leaderElection"] = map[string]any{"leaderElect": false}
	cfg["clientConnection"] = map[string]any{"kubeconfig": kubeconfig}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	opts := options.NewOptions()
	opts.ConfigFile = path
	opts.SecureServing.BindPort = 0 // nothing served
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_, sched, err := app.Setup(ctx, opts, plugins...)
	if err != nil {
		t.Fatal(err)
	}
	fw, ok := sched.Profiles["resclass-scheduler"]
	if !ok {
		t.Fatalf("no profile resclass-scheduler")
	}
	enabled := fw.ListPlugins()
	for _, point := range []struct {
		name string
		set  schedconfig.PluginSet
	}{{"PreFilter", enabled.PreFilter}, {"Filter", enabled.Filter}, {"PreScore", enabled.PreScore}, {"Score", enabled.Score}} {
		var names []string
		for _, p := range point.set.Enabled {
			names = append(names, p.Name)
		}
		if !slices.Contains(names, nodefit.Name) || slices.Contains(names, "NodeResourcesFit") || !slices.Contains(names, resourceclasses.Name) {
			t.Errorf("%s runs %v: want %s and %s, not NodeResourcesFit", point.name, names, resourceclasses.Name, nodefit.Name)
		}
	}
}
