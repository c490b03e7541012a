package gpuisolation

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func read(t *testing.T, name string) File {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseRuntimeConfig(data)
	if err != nil {
		return File{Path: "/etc/" + name, Status: FileInvalid, Err: err}
	}
	return File{Path: "/etc/" + name, Status: FileRead, Config: c}
}

func TestCondition(t *testing.T) {
	var (
		hardened  = read(t, "hardened.toml")
		defaults  = read(t, "package-default.toml")
		operator  = read(t, "gpu-operator.toml")
		misplaced = read(t, "misplaced-key.toml")
		invalid   = read(t, "wrong-type.toml")
		missing   = File{Path: PackageRuntimeConfig, Status: FileNotFound, Err: errors.New("no such file")}
		fifo      = File{Path: PackageRuntimeConfig, Status: FileUnreadable, Err: errors.New("a named pipe, not a file")}
	)
	for _, tc := range []struct {
		name  string
		files []File
		in    Input
		// status and reason of the condition, and words its message has.
		status metav1.ConditionStatus
		reason string
		words  []string
	}{
		{"hardened, CDI", []File{hardened, missing}, Input{GPUs: 8}, metav1.ConditionTrue, ReasonIsolated, []string{"refuses", "/etc/hardened.toml"}},
		{"package defaults", []File{defaults, missing}, Input{GPUs: 8}, metav1.ConditionFalse, ReasonRuntimeAcceptsEnvVar, []string{"has no " + KeyAcceptEnvVarUnprivileged + ", whose default is true", "= false"}},
		{"GPU operator's defaults", []File{missing, operator}, Input{GPUs: 8}, metav1.ConditionFalse, ReasonRuntimeAcceptsEnvVar, []string{"/etc/gpu-operator.toml: " + KeyAcceptEnvVarUnprivileged + " = true"}},
		{"the key in the wrong table", []File{misplaced}, Input{GPUs: 8}, metav1.ConditionFalse, ReasonRuntimeAcceptsEnvVar, nil},
		{"one of two files accepts", []File{hardened, operator}, Input{GPUs: 8}, metav1.ConditionFalse, ReasonRuntimeAcceptsEnvVar, []string{"/etc/gpu-operator.toml"}},
		{"accepting, and envvar strategy", []File{defaults}, Input{GPUs: 8, EnvVarStrategy: true}, metav1.ConditionFalse, ReasonRuntimeAcceptsEnvVar, []string{"use cdi-cri"}},
		{"hardened, envvar strategy", []File{hardened}, Input{GPUs: 8, EnvVarStrategy: true}, metav1.ConditionFalse, ReasonEnvVarStrategy, []string{"envvar", "cdi-cri"}},
		{"unknown, envvar strategy", []File{missing}, Input{GPUs: 8, EnvVarStrategy: true}, metav1.ConditionFalse, ReasonEnvVarStrategy, nil},
		{"no file", []File{missing, {Path: GPUOperatorRuntimeConfig, Status: FileNotFound}}, Input{GPUs: 8}, metav1.ConditionUnknown, ReasonRuntimeConfigNotFound, []string{"cannot be checked", PackageRuntimeConfig + " or " + GPUOperatorRuntimeConfig}},
		{"no file named", nil, Input{GPUs: 8}, metav1.ConditionUnknown, ReasonRuntimeConfigNotFound, []string{"--nvidia-runtime-config"}},
		{"invalid", []File{invalid}, Input{GPUs: 8}, metav1.ConditionUnknown, ReasonRuntimeConfigInvalid, []string{"is a string, want a boolean"}},
		{"unreadable", []File{fifo}, Input{GPUs: 8}, metav1.ConditionUnknown, ReasonRuntimeConfigUnreadable, []string{"named pipe"}},
		{"hardened and invalid", []File{hardened, invalid}, Input{GPUs: 8}, metav1.ConditionUnknown, ReasonRuntimeConfigInvalid, nil},
		{"no GPUs, no file", []File{missing}, Input{}, metav1.ConditionUnknown, ReasonNoGPUs, []string{"no GPUs"}},
		{"no GPUs, unreadable", []File{fifo}, Input{}, metav1.ConditionUnknown, ReasonNoGPUs, []string{"named pipe"}},
		{"no GPUs, envvar strategy, no file", []File{missing}, Input{EnvVarStrategy: true}, metav1.ConditionUnknown, ReasonNoGPUs, nil},
		{"no GPUs, hardened", []File{hardened}, Input{EnvVarStrategy: true}, metav1.ConditionTrue, ReasonIsolated, nil},
		{"no GPUs, accepting", []File{defaults}, Input{}, metav1.ConditionFalse, ReasonRuntimeAcceptsEnvVar, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Runtime{Files: tc.files}.Condition(tc.in)
			if c.Type != ConditionType || c.Status != tc.status || c.Reason != tc.reason {
				t.Fatalf("%s=%s/%s, want %s/%s: %s", c.Type, c.Status, c.Reason, tc.status, tc.reason, c.Message)
			}
			for _, w := range tc.words {
				if !strings.Contains(c.Message, w) {
					t.Errorf("message %q lacks %q", c.Message, w)
				}
			}
			if want := map[metav1.ConditionStatus]State{metav1.ConditionTrue: StateIsolated, metav1.ConditionFalse: StateUnisolated}[c.Status]; want != "" && StateOf(c) != want {
				t.Errorf("StateOf: %s, want %s", StateOf(c), want)
			}
		})
	}
	if s := StateOf(metav1.Condition{Status: metav1.ConditionUnknown, Reason: ReasonNoGPUs}); s != StateNoGPUs {
		t.Errorf("NoGPUs: %s", s)
	}
	if s := StateOf(metav1.Condition{Status: metav1.ConditionUnknown, Reason: ReasonRuntimeConfigInvalid}); s != StateUnknown {
		t.Errorf("invalid: %s", s)
	}
}

// TestCheck reads the files from a host root as the agent does.
func TestCheck(t *testing.T) {
	root := t.TempDir()
	data, err := os.ReadFile("testdata/hardened.toml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, PackageRuntimeConfig)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	r := Check(root, DefaultRuntimeConfigs)
	if c := r.Condition(Input{GPUs: 1}); c.Status != metav1.ConditionTrue {
		t.Errorf("hardened at the package's path, none at the operator's: %s/%s %s", c.Status, c.Reason, c.Message)
	}
	if len(r.Files) != 2 || r.Files[0].Status != FileRead || r.Files[1].Status != FileNotFound {
		t.Errorf("files: %+v", r.Files)
	}
}
