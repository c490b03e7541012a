package quota

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
)

const (
	configA = "apiVersion: apiserver.config.k8s.io/v1\nkind: ResourceQuotaConfiguration\nlimitedResources:\n- resource: pods\n  matchScopes: [{scopeName: CrossNamespacePodAffinity}]\n"
	configB = "apiVersion: apiserver.config.k8s.io/v1\nkind: ResourceQuotaConfiguration\nlimitedResources:\n- resource: pods\n  matchScopes: [{scopeName: PriorityClass, operator: Exists}]\n"
	invalid = "apiVersion: apiserver.config.k8s.io/v1\nkind: ResourceQuotaConfiguration\nlimitedResources:\n- resource: pods\n  matchScopes: [{scopeName: Bogus}]\n"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func removeFile(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}

func scopeOf(f *File) corev1.ResourceQuotaScope {
	s := f.Current().Scopes()
	if len(s) != 1 {
		return ""
	}
	return s[0].ScopeName
}

// loads records OnLoad calls.
type loads struct {
	mu    sync.Mutex
	calls []string
}

func (l *loads) record(cfg *Config, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.calls = append(l.calls, "error")
		return
	}
	l.calls = append(l.calls, fmt.Sprint(cfg.Scopes()[0].ScopeName))
}

func (l *loads) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.calls...)
}

func TestFileReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "quota.yaml")
	writeFile(t, path, configA)
	f, err := NewFile(path, 0, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	var l loads
	f.OnLoad = l.record
	first := f.Status()
	if scopeOf(f) != corev1.ResourceQuotaScopeCrossNamespacePodAffinity || first.Generation != 1 || first.Hash == "" || first.Failed {
		t.Fatalf("after NewFile: scope %q, status %+v", scopeOf(f), first)
	}

	steps := []struct {
		name      string
		change    func(t *testing.T)
		wantErr   string // substring; "" for success
		wantScope corev1.ResourceQuotaScope
		wantGen   int64
		wantCalls []string // OnLoad calls so far
	}{
		{name: "unchanged", change: func(*testing.T) {}, wantScope: "CrossNamespacePodAffinity", wantGen: 1},
		{name: "changed", change: func(t *testing.T) { writeFile(t, path, configB) },
			wantScope: "PriorityClass", wantGen: 2, wantCalls: []string{"PriorityClass"}},
		{name: "invalid keeps the last good config", change: func(t *testing.T) { writeFile(t, path, invalid) },
			wantErr: `limitedResources[0].matchScopes[0].scopeName: Unsupported value: "Bogus"`, wantScope: "PriorityClass", wantGen: 2,
			wantCalls: []string{"PriorityClass", "error"}},
		{name: "the same invalid content is reported once", change: func(*testing.T) {},
			wantErr: "Bogus", wantScope: "PriorityClass", wantGen: 2, wantCalls: []string{"PriorityClass", "error"}},
		{name: "back to the loaded content", change: func(t *testing.T) { writeFile(t, path, configB) },
			wantScope: "PriorityClass", wantGen: 2, wantCalls: []string{"PriorityClass", "error", "PriorityClass"}},
		{name: "unreadable keeps the last good config", change: func(t *testing.T) { removeFile(t, path) },
			wantErr: "no such file", wantScope: "PriorityClass", wantGen: 2, wantCalls: []string{"PriorityClass", "error", "PriorityClass", "error"}},
		{name: "still unreadable is reported once", change: func(*testing.T) {},
			wantErr: "no such file", wantScope: "PriorityClass", wantGen: 2, wantCalls: []string{"PriorityClass", "error", "PriorityClass", "error"}},
		{name: "readable again with new content", change: func(t *testing.T) { writeFile(t, path, configA) },
			wantScope: "CrossNamespacePodAffinity", wantGen: 3,
			wantCalls: []string{"PriorityClass", "error", "PriorityClass", "error", "CrossNamespacePodAffinity"}},
	}
	prev := first
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			step.change(t)
			err := f.Reload()
			st := f.Status()
			if (st.Generation != prev.Generation) != (st.Hash != prev.Hash) {
				t.Errorf("Hash %s -> %s while Generation %d -> %d", prev.Hash, st.Hash, prev.Generation, st.Generation)
			}
			prev = st
			if step.wantErr == "" {
				if err != nil || st.Failed || st.Err != nil {
					t.Errorf("Reload = %v, status %+v; want success", err, st)
				}
			} else {
				if err == nil || !strings.Contains(err.Error(), step.wantErr) {
					t.Errorf("Reload = %v, want an error containing %q", err, step.wantErr)
				}
				if !st.Failed || st.Err == nil || st.Err.Error() != err.Error() {
					t.Errorf("status %+v, want Failed with the Reload error", st)
				}
			}
			if got := scopeOf(f); got != step.wantScope {
				t.Errorf("Current() scope %q, want %q", got, step.wantScope)
			}
			if st.Generation != step.wantGen {
				t.Errorf("Generation %d, want %d", st.Generation, step.wantGen)
			}
			if got := l.get(); strings.Join(got, " ") != strings.Join(step.wantCalls, " ") {
				t.Errorf("OnLoad calls %q, want %q", got, step.wantCalls)
			}
		})
	}
	if f.Status().Hash != first.Hash {
		t.Error("the same content (configA) must have the same Hash")
	}
}

func TestNewFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "invalid.yaml"), invalid)
	writeFile(t, filepath.Join(dir, "empty.yaml"), "")
	writeFile(t, filepath.Join(dir, "huge.yaml"), configA+"# "+strings.Repeat("x", MaxFileBytes)+"\n")
	for _, tc := range []struct {
		name, path, wantErr string
	}{
		{name: "missing", path: filepath.Join(dir, "missing.yaml"), wantErr: "no such file"},
		{name: "invalid", path: filepath.Join(dir, "invalid.yaml"), wantErr: "invalid.yaml: limitedResources[0].matchScopes[0].scopeName"},
		{name: "empty file", path: filepath.Join(dir, "empty.yaml"), wantErr: "empty"},
		{name: "larger than a ConfigMap", path: filepath.Join(dir, "huge.yaml"), wantErr: "huge.yaml is larger than 1048576 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewFile(tc.path, 0, testr.New(t)); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("NewFile = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestFileNoPath(t *testing.T) {
	f, err := NewFile("", 0, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	if !f.Current().Empty() || f.Reload() != nil || f.Status().Failed {
		t.Errorf("a File without path must hold an empty config: %+v", f.Status())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := startFile(ctx, f)
	cancel()
	waitStopped(t, done)
}

// TestFileConfigMapSwap updates the file as the kubelet updates a mounted
// ConfigMap: the file is a symlink through ..data, and ..data is replaced
// by renaming a new symlink over it.
func TestFileConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	writeVersion := func(name, content string) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, name, "config.yaml"), content)
		if err := os.Symlink(name, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	writeVersion("..2026_01_01_00_00_00.1", configA)
	path := filepath.Join(dir, "config.yaml")
	if err := os.Symlink(filepath.Join("..data", "config.yaml"), path); err != nil {
		t.Fatal(err)
	}

	f, err := NewFile(path, 10*time.Millisecond, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	if scopeOf(f) != corev1.ResourceQuotaScopeCrossNamespacePodAffinity {
		t.Fatalf("initial scope %q", scopeOf(f))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := startFile(ctx, f)
	defer func() {
		cancel()
		waitStopped(t, done)
	}()

	writeVersion("..2026_01_01_00_00_01.2", configB)
	waitFor(t, "the swapped config", func() bool { return scopeOf(f) == corev1.ResourceQuotaScopePriorityClass })

	writeVersion("..2026_01_01_00_00_02.3", invalid)
	waitFor(t, "the invalid config to be reported", func() bool { return f.Status().Failed })
	if scopeOf(f) != corev1.ResourceQuotaScopePriorityClass {
		t.Errorf("an invalid swap replaced the config: scope %q", scopeOf(f))
	}
}

func startFile(ctx context.Context, f *File) <-chan error {
	done := make(chan error, 1)
	go func() { done <- f.Start(ctx) }()
	return done
}

func waitStopped(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Start = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Start did not return after its context was cancelled")
	}
}

// waitFor polls cond until it holds or 10s have passed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
