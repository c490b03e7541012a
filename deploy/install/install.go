// Package install renders resclass's install artifacts into objects: the
// kustomize base deploy/ and the Helm chart deploy/helm/resclass, with the
// kustomize and helm binaries `make e2e-binaries` builds into _output/bin.
// (Binaries, not kustomize's library: it imports Go's plugin package, which
// makes the linker bind every symbol at load time, and the e2e test binary,
// which links go-nvml's lazily bound NVML symbols, would no longer start on a
// machine without NVML.) Tests check the rendered sets
// (deploy/install_test.go) and dry-run them against a real apiserver.
package install

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const (
	// Namespace is where resclass runs (Pod Security restricted), except
	// the node agent.
	Namespace = "resclass-system"
	// NodeAgentNamespace is the node agent's own namespace (Pod Security
	// privileged, for its host paths), in both renders.
	NodeAgentNamespace = "resclass-node"
	// ReleaseName is the Helm release name HelmTemplate renders.
	ReleaseName = "resclass"
	// Chart is the Helm chart, relative to the repository root.
	Chart = "deploy/helm/resclass"
	// Base is the kustomize base, relative to the repository root.
	Base = "deploy"
	// KustomizeBinary is where `make e2e-binaries` builds kustomize, relative
	// to the repository root.
	KustomizeBinary = "_output/bin/kustomize"
	// HelmBinary is where `make e2e-binaries` builds helm, relative to the
	// repository root.
	HelmBinary = "_output/bin/helm"
)

// Kustomize renders the kustomize base of the repository the working directory
// is in.
func Kustomize() ([]*unstructured.Unstructured, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	return KustomizeDir(filepath.Join(root, Base))
}

// KustomizeDir renders the kustomization in dir as `kubectl kustomize dir`
// does (files only below dir, builtin plugins only).
func KustomizeDir(dir string) ([]*unstructured.Unstructured, error) {
	out, err := run(context.Background(), KustomizeBinary, nil, "build", dir)
	if err != nil {
		return nil, err
	}
	return Decode(out)
}

// HelmTemplate renders the chart as
//
//	helm template resclass deploy/helm/resclass --namespace resclass-system --include-crds -f VALUES
//
// with values (nil: the chart's defaults) merged over values.yaml. The chart
// renders no Namespace: `helm install --namespace resclass-system
// --create-namespace` creates it (see the chart's README).
func HelmTemplate(ctx context.Context, values map[string]any) ([]*unstructured.Unstructured, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	args := []string{"template", ReleaseName, filepath.Join(root, Chart), "--namespace", Namespace, "--include-crds"}
	if values != nil {
		data, err := yaml.Marshal(values)
		if err != nil {
			return nil, err
		}
		f, err := os.CreateTemp("", "resclass-values-*.yaml")
		if err != nil {
			return nil, err
		}
		defer func() { _ = os.Remove(f.Name()) }()
		if _, err := f.Write(data); err != nil {
			_ = f.Close()
			return nil, err
		}
		if err := f.Close(); err != nil {
			return nil, err
		}
		args = append(args, "--values", f.Name())
	}
	out, err := Helm(ctx, args...)
	if err != nil {
		return nil, err
	}
	return Decode(out)
}

// Helm runs _output/bin/helm with args in the repository root and returns its
// standard output. Helm keeps its cache, config and data in a temporary
// directory: nothing of the user's helm setup is read or written.
func Helm(ctx context.Context, args ...string) ([]byte, error) {
	home, err := os.MkdirTemp("", "resclass-helm-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(home) }()
	return run(ctx, HelmBinary, []string{
		"HELM_CACHE_HOME=" + filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME=" + filepath.Join(home, "config"),
		"HELM_DATA_HOME=" + filepath.Join(home, "data"),
	}, args...)
}

// run runs one of the tools `make e2e-binaries` builds, in the repository
// root, and returns its standard output.
func run(ctx context.Context, tool string, env []string, args ...string) ([]byte, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(root, tool)
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s is missing: run `make e2e-binaries` (it builds it from hack/tools)", tool)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %v: %w\n%s%s", filepath.Base(tool), args, err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// Decode reads a stream of YAML (or JSON) documents into objects, skipping
// empty documents.
func Decode(data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("document %d: %w", len(objs)+1, err)
		}
		if len(m) == 0 {
			continue
		}
		obj := &unstructured.Unstructured{Object: m}
		if obj.GetKind() == "" || obj.GetAPIVersion() == "" {
			return nil, fmt.Errorf("document %d has no apiVersion or kind:\n%s", len(objs)+1, doc)
		}
		objs = append(objs, obj)
	}
}

// RepoRoot is the directory of the repository's go.mod, found from the working
// directory upwards.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the resclass repository (no go.mod above the working directory)")
		}
		dir = parent
	}
}
