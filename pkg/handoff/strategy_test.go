package handoff

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/resclass/resclass/pkg/cdispec"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/internal/watchdog"
)

func TestParseStrategies(t *testing.T) {
	for in, want := range map[string]string{
		"envvar": "envvar", "cdi-cri": "cdi-cri", "cdi-annotations": "cdi-annotations",
		"envvar,cdi-cri": "envvar,cdi-cri", "cdi-cri, envvar,cdi-cri": "cdi-cri,envvar",
	} {
		got, err := ParseStrategies(in)
		if err != nil || got.String() != want {
			t.Errorf("ParseStrategies(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"", "cdi", "envvar,", "volume-mounts", strings.Repeat("envvar,", 100)} {
		if got, err := ParseStrategies(in); err == nil {
			t.Errorf("ParseStrategies(%q) = %v, want an error", in, got)
		}
	}
	var none Strategies
	if none.Has(StrategyEnvVar) || !none.Has(StrategyCDICRI) || !none.CDI() || none.String() != "cdi-cri" {
		t.Errorf("no strategy set must mean cdi-cri")
	}
}

// TestStrategiesIsolated: envvar, alone or with a CDI strategy, is the one
// that needs a runtime which takes the variable from any container.
func TestStrategiesIsolated(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"", true}, {"cdi-cri", true}, {"cdi-annotations", true}, {"cdi-cri,cdi-annotations", true},
		{"envvar", false}, {"envvar,cdi-cri", false}, {"cdi-annotations,envvar", false},
	} {
		var s Strategies
		if tc.in != "" {
			if err := s.Set(tc.in); err != nil {
				t.Fatal(err)
			}
		}
		if got := s.Isolated(); got != tc.want {
			t.Errorf("%q: Isolated() = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// allocateWith allocates GPU-0 and GPU-2 to one container in two classes
// under strategies.
func allocateWith(t *testing.T, strategies Strategies) []*pluginapi.ContainerAllocateResponse {
	t.Helper()
	p := pod("a", map[string]map[string][]string{"main": {"nvidia.high.mem": {"GPU-2"}, "any-gpu": {"GPU-0"}}})
	f := newFixture(t, p)
	f.alloc.cfg.DeviceListStrategies = strategies
	f.alloc.handoff = f.alloc.kindsHandoff()
	var out []*pluginapi.ContainerAllocateResponse
	for _, c := range []struct{ resource, id string }{{highMem, "GPU-2"}, {"class.resclass.io/any-gpu", "GPU-0"}} {
		resp, err := f.allocate(c.resource, c.id)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, resp)
	}
	return out
}

// TestDeviceListStrategies: each strategy sends what NVIDIA's plugin sends in
// that mode, and nothing of the others.
func TestDeviceListStrategies(t *testing.T) {
	cdiNames := func(resps []*pluginapi.ContainerAllocateResponse) (cri, annotated []string, keys map[string]bool) {
		keys = map[string]bool{}
		for _, r := range resps {
			for _, d := range r.CdiDevices {
				cri = append(cri, d.Name)
			}
			// The kubelet merges the annotations of a container's classes:
			// every class needs its own key.
			for k, v := range r.Annotations {
				if keys[k] {
					t.Errorf("annotation key %s used by two classes", k)
				}
				keys[k] = true
				annotated = append(annotated, strings.Split(v, ",")...)
			}
		}
		slices.Sort(cri)
		slices.Sort(annotated)
		return cri, annotated, keys
	}
	want := []string{"resclass.io/gpu=GPU-0", "resclass.io/gpu=GPU-2"}

	resps := allocateWith(t, Strategies{StrategyCDICRI})
	cri, annotated, _ := cdiNames(resps)
	if !slices.Equal(cri, want) || len(annotated) != 0 {
		t.Errorf("cdi-cri: CRI field %v, annotations %v; want %v in the CRI field only", cri, annotated, want)
	}
	for _, r := range resps {
		if _, ok := r.Envs[nvidiagpu.EnvVisibleDevices]; ok || len(r.Devices) != 0 {
			t.Errorf("cdi-cri: NVIDIA_VISIBLE_DEVICES or device nodes sent: %v %v", r.Envs, r.Devices)
		}
		if r.Envs["RESCLASS_DEVICES_NVIDIA_HIGH_MEM"] == "" && r.Envs["RESCLASS_DEVICES_ANY_GPU"] == "" {
			t.Errorf("cdi-cri: the class variable is missing: %v", r.Envs)
		}
	}

	resps = allocateWith(t, Strategies{StrategyCDIAnnotations})
	cri, annotated, keys := cdiNames(resps)
	if len(cri) != 0 || !slices.Equal(annotated, want) || len(keys) != 2 {
		t.Errorf("cdi-annotations: CRI field %v, annotations %v under %v; want %v in two annotations", cri, annotated, keys, want)
	}
	for k := range keys {
		if !strings.HasPrefix(k, cdi.AnnotationPrefix) {
			t.Errorf("annotation %s lacks %s", k, cdi.AnnotationPrefix)
		}
	}
	// What the runtime parses out of them.
	merged := map[string]string{}
	for _, r := range resps {
		for k, v := range r.Annotations {
			merged[k] = v
		}
	}
	if _, devices, err := cdi.ParseAnnotations(merged); err != nil || len(devices) != 2 {
		t.Errorf("the runtime's parse of %v: %v, %v", merged, devices, err)
	}

	resps = allocateWith(t, Strategies{StrategyEnvVar, StrategyCDICRI})
	cri, _, _ = cdiNames(resps)
	if !slices.Equal(cri, want) || resps[0].Envs[nvidiagpu.EnvVisibleDevices] != "GPU-0,GPU-2" {
		t.Errorf("envvar,cdi-cri: CRI field %v, env %v", cri, resps[0].Envs)
	}
}

// TestCDINamesResolve is issue 19's failure 5: the names Allocate sends must
// resolve in the CDI cache a runtime builds from the spec directory, or the
// runtime refuses the container ("unresolvable CDI devices"). The spec is the
// agent's (pkg/cdispec), read back by the CDI library as containerd does.
func TestCDINamesResolve(t *testing.T) {
	resps := allocateWith(t, Strategies{StrategyCDICRI})
	var names []string
	for _, r := range resps {
		for _, d := range r.CdiDevices {
			names = append(names, d.Name)
		}
	}
	dir := t.TempDir()
	// Without the spec: exactly the runtime's refusal.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cache.InjectDevices(&oci.Spec{}, names...); err == nil || !strings.Contains(err.Error(), "unresolvable CDI devices") {
		t.Fatalf("no spec: %v, want unresolvable CDI devices", err)
	}

	hostRoot := t.TempDir()
	mknod(t, hostRoot, "/dev/nvidia0", 0)
	mknod(t, hostRoot, "/dev/nvidia2", 2)
	mknod(t, hostRoot, "/dev/nvidiactl", 255)
	spec, err := cdispec.Generate(cdispec.Config{HostRoot: hostRoot, Kinds: kinds.Builtin}, inventory())
	if err != nil {
		t.Fatal(err)
	}
	w, err := cdispec.NewWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(spec); err != nil {
		t.Fatal(err)
	}
	if err := cache.Refresh(); err != nil {
		t.Fatal(err)
	}
	ociSpec := &oci.Spec{}
	if unresolved, err := cache.InjectDevices(ociSpec, names...); err != nil {
		t.Fatalf("with the agent's spec: %v (unresolved %v)", err, unresolved)
	}
	var nodes []string
	for _, d := range ociSpec.Linux.Devices {
		nodes = append(nodes, d.Path)
	}
	slices.Sort(nodes)
	if !slices.Equal(nodes, []string{"/dev/nvidia0", "/dev/nvidia2", "/dev/nvidiactl"}) {
		t.Errorf("device nodes injected: %v", nodes)
	}
	if !slices.Contains(ociSpec.Process.Env, "NVIDIA_VISIBLE_DEVICES=void") {
		t.Errorf("env injected: %v", ociSpec.Process.Env)
	}
}

// mknod creates the character device p (below root) with NVIDIA's major 195.
func mknod(t *testing.T, root, p string, minor uint32) {
	t.Helper()
	full := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(full, unix.S_IFCHR|0o666, int(unix.Mkdev(195, minor))); err != nil {
		t.Fatalf("mknod %s (the tests run as root): %v", full, err)
	}
}

func FuzzParseStrategies(f *testing.F) {
	for _, s := range []string{"envvar", "cdi-cri,envvar", "cdi-annotations", "", ",", "envvar,,cdi-cri", " cdi-cri "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		watchdog.Run(t, func() {
			got, err := ParseStrategies(s)
			if err != nil {
				return
			}
			// What parses prints back to itself, and has no duplicates.
			again, err := ParseStrategies(got.String())
			if err != nil || !slices.Equal(again, got) || len(got) > len(knownStrategies) {
				t.Fatalf("%q parsed to %v, which reads back as %v, %v", s, got, again, err)
			}
		})
	})
}
