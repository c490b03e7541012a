package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/e2e/framework/cri"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/cdispec"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	"github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// TestDeviceListStrategies runs the node agent with each device-list
// strategy against a real kubelet and checks what reaches the runtime's
// CreateContainer (issue 19, failure 5: CDI names were always sent and no
// spec was written, so a runtime with CDI enabled failed every GPU
// container). With a CDI strategy the names must resolve, through the CDI
// library as containerd and CRI-O use it, in the spec the agent wrote, to the
// GPU's own device node.
func TestDeviceListStrategies(t *testing.T) {
	ctx, cancel := agentTest(t, 3*time.Minute)
	defer cancel()
	const class = "e2e-cdi-gpu"
	schedClass(t, ctx, class, v1alpha1.ResourceSelectorRequirement{Key: "kind", Operator: v1alpha1.ResourceSelectorOpIn, Values: []string{"nvidia-gpu"}})

	const nodeName = "cdi-node"
	kn, err := cluster.AddKubeletNode(ctx, framework.NodeOptions{Name: nodeName})
	if err != nil {
		t.Fatal(err)
	}
	dgx, root := mockDGX(t)
	// The host's /dev as the agent sees it: the GPUs' and the control
	// device nodes, and the driver's libraries (NVIDIA's major is 195).
	for i := range 8 {
		e2eMknod(t, root, "/dev/nvidia"+strconv.Itoa(i), 195, uint32(i))
	}
	e2eMknod(t, root, "/dev/nvidiactl", 195, 255)
	libDir := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	if err := os.MkdirAll(libDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(libDir, "libcuda.so.580.95.05"), []byte("elf"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("libcuda.so.580.95.05", filepath.Join(libDir, "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	uuids := dgx.UUIDs()
	arc, akc := agentClients(t, nodeName)
	res := corev1.ResourceName(v1alpha1.ResourceNamePrefix + class)
	ns := newNamespace(t, ctx, nil)

	for i, tc := range []struct {
		strategies handoff.Strategies
		check      func(t *testing.T, r cri.Record, gpu string, cdiDir string)
	}{
		{handoff.Strategies{handoff.StrategyEnvVar}, func(t *testing.T, r cri.Record, gpu, _ string) {
			if r.Env[nvidiagpu.EnvVisibleDevices] != gpu || len(r.CDIDevices) != 0 || hasCDIAnnotation(r) {
				t.Errorf("envvar: env %v, CDI devices %v, annotations %v; want NVIDIA_VISIBLE_DEVICES=%s and no CDI", r.Env, r.CDIDevices, r.Annotations, gpu)
			}
			var nodes []string
			for _, d := range r.Devices {
				nodes = append(nodes, d.HostPath)
			}
			if !slices.Contains(nodes, "/dev/nvidia0") || !slices.Contains(nodes, "/dev/nvidiactl") {
				t.Errorf("envvar: device nodes %v", nodes)
			}
		}},
		{handoff.Strategies{handoff.StrategyCDICRI}, func(t *testing.T, r cri.Record, gpu, cdiDir string) {
			var names []string
			for _, d := range r.CDIDevices {
				names = append(names, d.Name)
			}
			if !slices.Equal(names, []string{cdispec.DeviceName(gpu)}) || hasCDIAnnotation(r) || r.Env[nvidiagpu.EnvVisibleDevices] != "" {
				t.Errorf("cdi-cri: CDI devices %v, annotations %v, env %v", names, r.Annotations, r.Env)
			}
			resolve(t, cdiDir, names, "/dev/nvidia1")
		}},
		{handoff.Strategies{handoff.StrategyCDIAnnotations}, func(t *testing.T, r cri.Record, gpu, cdiDir string) {
			_, names, err := cdi.ParseAnnotations(r.Annotations)
			if err != nil || !slices.Equal(names, []string{cdispec.DeviceName(gpu)}) || len(r.CDIDevices) != 0 {
				t.Errorf("cdi-annotations: annotations %v (%v), CDI devices %v", r.Annotations, err, r.CDIDevices)
			}
			resolve(t, cdiDir, names, "/dev/nvidia2")
		}},
	} {
		t.Run(tc.strategies.String(), func(t *testing.T) {
			cdiDir := filepath.Join(t.TempDir(), "cdi")
			actx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			wg.Go(func() {
				agent := nodeagent.New(nodeagent.Config{
					NodeName: nodeName, HostRoot: root,
					Kinds: kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{
						Binding: dgx,
						Health:  nvml.HealthOptions{RecoveryAfter: time.Minute, WaitTimeout: 100 * time.Millisecond},
					}}),
					PollInterval: 200 * time.Millisecond, ResyncInterval: time.Minute,
					PluginDir: kn.PluginDir(), WaitForPod: 2 * time.Second, PodResourcesSocket: kn.PodResourcesSocket(),
					DeviceListStrategies: tc.strategies, CDISpecDir: cdiDir,
				}, arc, akc)
				if err := agent.Run(actx); err != nil {
					t.Errorf("agent: %v", err)
				}
			})
			defer func() { stop(); wg.Wait() }()
			// This agent's endpoint serves (the last one's was replaced).
			since := time.Now()
			err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				n, err := cluster.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				q := n.Status.Allocatable[res]
				return q.Value() == 8 && kubeletLogLines(kn, since, "Processed device updates for resource", class, "healthyCount=8") > 0, nil
			})
			if err != nil {
				t.Fatalf("endpoint not serving: %v", err)
			}
			if tc.strategies.CDI() {
				if _, err := os.Stat(filepath.Join(cdiDir, cdispec.FileName)); err != nil {
					t.Errorf("no CDI spec written: %v", err)
				}
			} else if _, err := os.Stat(cdiDir); err == nil {
				t.Errorf("envvar wrote into the CDI directory")
			}
			gpu := uuids[i]
			p := classPod(t, ctx, ns, "p-"+strconv.Itoa(i), nodeName, []containerSpec{{name: "main", classes: map[string][]string{class: {gpu}}}})
			r := waitRecord(t, ctx, kn, ns, p, "main")
			if r.Env[handoff.ClassEnv(class)] != gpu {
				t.Errorf("%s=%q in every mode, want %s", handoff.ClassEnv(class), r.Env[handoff.ClassEnv(class)], gpu)
			}
			tc.check(t, r, gpu, cdiDir)
		})
	}
}

func hasCDIAnnotation(r cri.Record) bool {
	keys, _, _ := cdi.ParseAnnotations(r.Annotations)
	return len(keys) > 0
}

// resolve injects names into an empty OCI spec from the CDI directory, as a
// runtime does at CreateContainer, and checks that the GPU's device node is in
// the result.
func resolve(t *testing.T, dir string, names []string, node string) {
	t.Helper()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &oci.Spec{}
	if unresolved, err := cache.InjectDevices(spec, names...); err != nil {
		t.Fatalf("the runtime would refuse the container: %v (unresolved %v; spec errors %v)", err, unresolved, cache.GetErrors())
	}
	var nodes []string
	for _, d := range spec.Linux.Devices {
		nodes = append(nodes, d.Path)
	}
	if !slices.Contains(nodes, node) || !slices.Contains(nodes, "/dev/nvidiactl") {
		t.Errorf("CDI injected device nodes %v, want %s and /dev/nvidiactl", nodes, node)
	}
	var mounted bool
	for _, m := range spec.Mounts {
		mounted = mounted || m.Destination == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
	}
	if !mounted {
		t.Errorf("CDI mounts %v lack libcuda.so.1", spec.Mounts)
	}
}

func e2eMknod(t *testing.T, root, p string, major, minor uint32) {
	t.Helper()
	full := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(full, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
		t.Fatalf("mknod %s (the e2e tests run as root): %v", p, err)
	}
}
