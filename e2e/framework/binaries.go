package framework

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/resclass/resclass/deploy/install"
)

// binaries are the executables a cluster runs.
type binaries struct {
	etcd, apiserver, controllerManager, kubelet string // from the pinned Kubernetes release
	scheduler, webhook, node                    string // resclass's
	kwok, kwokStages                            string // simulated nodes (hack/tools) and the stages it plays
}

// findBinaries looks for every binary in dir, by default _output/bin of the
// repository, and says how to build them if one is missing.
func findBinaries(dir string) (binaries, error) {
	if dir == "" {
		root, err := RepoRoot()
		if err != nil {
			return binaries{}, err
		}
		dir = filepath.Join(root, "_output", "bin")
	}
	b := binaries{
		etcd:              filepath.Join(dir, "etcd"),
		apiserver:         filepath.Join(dir, "kube-apiserver"),
		controllerManager: filepath.Join(dir, "kube-controller-manager"),
		kubelet:           filepath.Join(dir, "kubelet"),
		scheduler:         filepath.Join(dir, "scheduler"),
		webhook:           filepath.Join(dir, "webhook"),
		node:              filepath.Join(dir, "e2e-node"),
		kwok:              filepath.Join(dir, "kwok"),
		kwokStages:        filepath.Join(dir, "kwok-stages.yaml"),
	}
	// kwok is checked when simulated nodes are first asked for: the demo runs without it.
	var missing []string
	for _, p := range []string{b.etcd, b.apiserver, b.controllerManager, b.kubelet, b.scheduler, b.webhook, b.node} {
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, filepath.Base(p))
		}
	}
	if len(missing) > 0 {
		return binaries{}, fmt.Errorf("missing %v in %s: run `make e2e-binaries` (the first build takes a few minutes)", missing, dir)
	}
	return b, nil
}

// RepoRoot is the directory of the repository's go.mod, found from the working
// directory upwards.
func RepoRoot() (string, error) { return install.RepoRoot() }
