package realgpu

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/config"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/cdispec"
	rcfake "github.com/resclass/resclass/pkg/client/clientset/versioned/fake"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	"github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// The third real-GPU check (issue 19): the agent's device-plugin endpoint,
// driven through the kubelet's own device manager
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager, the package the kubelet
// runs, in this process), hands the GPU a pod's assignment names to its
// container, in each device-list strategy; with CDI, the spec the agent wrote
// resolves, through the CDI library as containerd and CRI-O use it, to the
// GPU's device nodes on the host.
//
// What is real and what is not: the kubelet's device manager (registration,
// ListAndWatch, GetPreferredAllocation, Allocate, the container's run options)
// and the node agent (nodeagent.New(...).Run, as `node-agent serve` starts it:
// discovery, endpoints, hand-off, CDI spec) are; NVML is the machine's driver
// (TestKubeletHandsOutARealGPU) or go-nvml's mock (TestKubeletHandsOutAMockGPU,
// which runs wherever `go test ./...` does). The apiserver is client-go's fake
// clientset (the bundle carries no apiserver; e2e/deviceplugin_test.go and
// e2e/cdi_test.go run the same path against a real one and a real kubelet).
// No container is started: the test stops at what the kubelet would pass to
// the runtime, and at the OCI edits the runtime would make of the CDI names.

// TestKubeletHandsOutARealGPU runs the scenario on the machine's GPUs. Without
// a driver it skips (fails with RESCLASS_REQUIRE_GPU=1).
func TestKubeletHandsOutARealGPU(t *testing.T) {
	// NVML must open here before anything else: skip, or fail, saying why.
	d := open(t, library())
	devices, err := d.Discover()
	if err != nil {
		t.Fatal(err)
	}
	_ = d.Close()
	if gpus := gpusOf(devices); len(gpus) == 0 {
		t.Fatalf("NVML opened but lists no GPU: %v", devices)
	}
	if !inPrivateKubeletDir(t) {
		return
	}
	runKubeletScenario(t, scenario{
		hostRoot: "/",
		// As `node-agent serve --nvml-library=$RESCLASS_NVML_LIBRARY` loads
		// it: the symbol check first, then go-nvml.
		library: &nvml.Library{Path: os.Getenv(EnvLibrary)},
	})
}

// scenario is where the agent finds its GPUs.
type scenario struct {
	hostRoot string
	// library, or nvmlMock when nil.
	library  *nvml.Library
	nvmlMock lib.Interface
}

// runKubeletScenario runs, for each device-list strategy, the kubelet's device
// manager and the node agent on the kubelet's device-plugin directory, and
// admits one pod whose assignment names the node's last GPU.
func runKubeletScenario(t *testing.T, sc scenario) {
	// The GPUs as the agent will see them, to name one in the assignment.
	l := sc.nvmlMock
	if sc.library != nil {
		loaded, err := sc.library.Load()
		if err != nil {
			t.Fatal(err)
		}
		l = loaded
	}
	d, err := nvml.Open(l, sc.hostRoot)
	if err != nil {
		t.Fatal(err)
	}
	devices, err := d.Discover()
	_ = d.Close()
	if err != nil {
		t.Fatal(err)
	}
	gpus := gpusOf(devices)
	// The last GPU: on a machine with several, the kubelet takes it only
	// because the agent's GetPreferredAllocation steers it there.
	gpu := gpus[len(gpus)-1]
	minor, ok := gpu.Attributes[v1alpha1.AttributeMinor]
	if !ok || minor.IntValue == nil {
		t.Fatalf("GPU %s has no minor number: %v", gpu.ID, gpu.Attributes)
	}
	gpuNode := "/dev/nvidia" + strconv.FormatInt(*minor.IntValue, 10)
	t.Logf("%d GPUs; the pod is assigned %s (%s, %s)", len(gpus), gpu.ID, attr(gpu, v1alpha1.AttributeProduct), gpuNode)

	for _, strategy := range []handoff.DeviceListStrategy{handoff.StrategyEnvVar, handoff.StrategyCDICRI, handoff.StrategyCDIAnnotations} {
		t.Run(string(strategy), func(t *testing.T) {
			cdiDir := t.TempDir()
			opts, held := admit(t, sc, handoff.Strategies{strategy}, cdiDir, len(gpus), gpu.ID)
			if !slices.Equal(held, []string{gpu.ID}) {
				t.Fatalf("the kubelet holds %v for the container, want the assigned %s", held, gpu.ID)
			}
			env := map[string]string{}
			for _, e := range opts.Envs {
				env[e.Name] = e.Value
			}
			if got := env[handoff.ClassEnv(class)]; got != gpu.ID {
				t.Errorf("%s=%q, want %s", handoff.ClassEnv(class), got, gpu.ID)
			}
			var cdiNames []string
			for _, c := range opts.CDIDevices {
				cdiNames = append(cdiNames, c.Name)
			}
			annotations := map[string]string{}
			for _, a := range opts.Annotations {
				annotations[a.Name] = a.Value
			}
			_, annotated, err := cdi.ParseAnnotations(annotations)
			if err != nil {
				t.Errorf("annotations %v: %v", annotations, err)
			}
			want := []string{cdispec.DeviceName(gpu.ID)}
			switch strategy {
			case handoff.StrategyEnvVar:
				if env[nvidiagpu.EnvVisibleDevices] != gpu.ID || len(cdiNames) != 0 || len(annotated) != 0 {
					t.Errorf("envvar: env %v, CDI devices %v, annotations %v; want NVIDIA_VISIBLE_DEVICES=%s and no CDI", env, cdiNames, annotations, gpu.ID)
				}
				var paths []string
				for _, dev := range opts.Devices {
					paths = append(paths, dev.PathOnHost)
					if dev.PathInContainer != dev.PathOnHost {
						t.Errorf("device node %s is %s in the container", dev.PathOnHost, dev.PathInContainer)
					}
					hostDeviceNode(t, sc.hostRoot, dev.PathOnHost)
				}
				if !slices.Contains(paths, gpuNode) || !slices.Contains(paths, "/dev/nvidiactl") {
					t.Errorf("envvar: device nodes %v, want %s and /dev/nvidiactl", paths, gpuNode)
				}
				t.Logf("envvar: the container gets NVIDIA_VISIBLE_DEVICES=%s and the device nodes %v", env[nvidiagpu.EnvVisibleDevices], paths)
			case handoff.StrategyCDICRI:
				if !slices.Equal(cdiNames, want) || len(annotated) != 0 || env[nvidiagpu.EnvVisibleDevices] != "" || len(opts.Devices) != 0 {
					t.Errorf("cdi-cri: CDI devices %v, annotations %v, env %v, device nodes %v; want CDI devices %v only", cdiNames, annotations, env, opts.Devices, want)
				}
				resolveOnHost(t, sc.hostRoot, cdiDir, cdiNames, gpuNode)
			case handoff.StrategyCDIAnnotations:
				if !slices.Equal(annotated, want) || len(cdiNames) != 0 || env[nvidiagpu.EnvVisibleDevices] != "" || len(opts.Devices) != 0 {
					t.Errorf("cdi-annotations: annotations %v, CDI devices %v, env %v, device nodes %v; want the annotation naming %v only", annotations, cdiNames, env, opts.Devices, want)
				}
				resolveOnHost(t, sc.hostRoot, cdiDir, annotated, gpuNode)
			}
		})
	}
}

const (
	class    = "realgpu-any"
	nodeName = "realgpu-node"
)

// admit starts the kubelet's device manager and the agent, waits until the
// kubelet counts the class's GPUs, and allocates for a pod whose assignment
// names gpu; it returns what the kubelet would give the container's runtime
// and the device ids the kubelet holds for it.
func admit(t *testing.T, sc scenario, strategies handoff.Strategies, cdiDir string, gpus int, gpu string) (*devicemanager.DeviceRunContainerOptions, []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logger := klog.Background()
	dir := pluginapi.DevicePluginPath
	emptyDir(t, dir)

	pod := assignedPod(gpu)
	var podsMu sync.Mutex
	var active []*corev1.Pod

	// The kubelet's device manager, as the kubelet's container manager makes
	// it: topology manager policy none (the kubelet's default), no pods yet.
	topology, err := topologymanager.NewManager(nil, topologymanager.PolicyNone, topologymanager.ContainerTopologyScope, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubelet, err := devicemanager.NewManagerImpl(nil, topology)
	if err != nil {
		t.Fatal(err)
	}
	activePods := func() []*corev1.Pod {
		podsMu.Lock()
		defer podsMu.Unlock()
		return slices.Clone(active)
	}
	ready := kubeletconfig.NewSourcesReady(func(sets.Set[string]) bool { return true })
	if err := kubelet.Start(logger, activePods, ready, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = kubelet.Stop(logger) }()

	// The agent, as `node-agent serve` runs it, on the kubelet's directory.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "realgpu-node-uid"}}
	rc := &v1alpha1.ResourceClass{
		ObjectMeta: metav1.ObjectMeta{Name: class},
		Spec: v1alpha1.ResourceClassSpec{ResourceSelector: []v1alpha1.ResourcePropertySelector{{MatchExpressions: []v1alpha1.ResourceSelectorRequirement{
			{Key: "kind", Operator: v1alpha1.ResourceSelectorOpIn, Values: []string{string(v1alpha1.DeviceKindNvidiaGPU)}},
		}}}},
	}
	agent := nodeagent.New(nodeagent.Config{
		NodeName: nodeName, HostRoot: sc.hostRoot,
		Kinds: kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{
			Binding: sc.nvmlMock, Library: sc.library,
			Health: nvml.HealthOptions{RecoveryAfter: time.Minute, WaitTimeout: 100 * time.Millisecond},
		}}),
		PollInterval: time.Second, ResyncInterval: time.Minute,
		PluginDir: dir, WaitForPod: 2 * time.Second, ShutdownTimeout: time.Second,
		DeviceListStrategies: strategies, CDISpecDir: cdiDir, CDIDriverRoot: "/",
	}, rcfake.NewClientset(rc), k8sfake.NewClientset(node, pod))
	actx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.Run(actx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}()

	resourceName := corev1.ResourceName(v1alpha1.ResourceNamePrefix + class)
	err = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		_, allocatable, _ := kubelet.GetCapacity()
		q := allocatable[resourceName]
		return q.Value() == int64(gpus), nil
	})
	if err != nil {
		_, allocatable, _ := kubelet.GetCapacity()
		t.Fatalf("the kubelet never counted the class's %d GPUs: allocatable %v", gpus, allocatable)
	}

	podsMu.Lock()
	active = append(active, pod)
	podsMu.Unlock()
	container := &pod.Spec.Containers[0]
	if err := kubelet.Allocate(pod, container); err != nil {
		t.Fatalf("the kubelet's Allocate: %v", err)
	}
	opts, err := kubelet.GetDeviceRunContainerOptions(ctx, pod, container)
	if err != nil {
		t.Fatal(err)
	}
	held := kubelet.GetDevices(string(pod.UID), container.Name)[string(resourceName)]
	var ids []string
	for id := range held {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return opts, ids
}

// assignedPod is a pod bound to the node whose container "cuda" asks for one
// device of the class and was assigned gpu by the scheduler.
func assignedPod(gpu string) *corev1.Pod {
	a, err := assignment.Encode(&assignment.Assignment{Node: nodeName, Containers: []assignment.Container{{Name: "cuda", Classes: map[string][]string{class: {gpu}}}}})
	if err != nil {
		panic(err)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "cuda", Namespace: "ml", UID: types.UID("realgpu-pod-" + strconv.FormatInt(time.Now().UnixNano(), 36)),
			Annotations: map[string]string{assignment.AnnotationKey: a},
		},
		Spec: corev1.PodSpec{
			NodeName: nodeName, SchedulerName: "resclass-scheduler",
			Containers: []corev1.Container{{Name: "cuda", Image: "nvcr.io/nvidia/cuda:12.8.0-base-ubuntu24.04", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{corev1.ResourceName(v1alpha1.ResourceNamePrefix + class): resource.MustParse("1")},
			}}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
}

// resolveOnHost resolves names in the CDI spec directory as a runtime does
// and checks the OCI edits: the GPU's device node and the control node, each
// the host's own (a character device with the numbers the spec gives), and
// every mounted driver file present on the host.
func resolveOnHost(t *testing.T, hostRoot, cdiDir string, names []string, gpuNode string) {
	t.Helper()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(cdiDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &oci.Spec{}
	if unresolved, err := cache.InjectDevices(spec, names...); err != nil {
		t.Fatalf("CDI names %v in the agent's spec (%s): %v (unresolved %v)", names, filepath.Join(cdiDir, cdispec.FileName), err, unresolved)
	}
	if spec.Linux == nil {
		t.Fatalf("CDI %v: no device edits", names)
	}
	var paths []string
	for _, dev := range spec.Linux.Devices {
		paths = append(paths, dev.Path)
		major, minor := hostDeviceNode(t, hostRoot, dev.Path)
		if dev.Type != "c" || dev.Major != major || dev.Minor != minor {
			t.Errorf("CDI device node %s: type %s %d:%d, the host's is c %d:%d", dev.Path, dev.Type, dev.Major, dev.Minor, major, minor)
		}
	}
	if !slices.Contains(paths, gpuNode) || !slices.Contains(paths, "/dev/nvidiactl") {
		t.Errorf("CDI %v: device nodes %v, want %s and /dev/nvidiactl", names, paths, gpuNode)
	}
	var mounts []string
	for _, m := range spec.Mounts {
		mounts = append(mounts, m.Destination)
		if st, err := os.Stat(filepath.Join(hostRoot, m.Source)); err != nil || !st.Mode().IsRegular() {
			t.Errorf("CDI mount %s: the host's %s is not a file (%v)", m.Destination, m.Source, err)
		}
	}
	if !slices.ContainsFunc(mounts, func(m string) bool { return strings.HasSuffix(m, "/"+nvml.LibraryName) }) {
		t.Errorf("CDI %v: mounts %v, want the driver's %s", names, mounts, nvml.LibraryName)
	}
	env := ""
	if spec.Process != nil {
		env = strings.Join(spec.Process.Env, " ")
	}
	t.Logf("CDI %v resolve to the device nodes %v, the mounts %v and the environment %q", names, paths, mounts, env)
}

// hostDeviceNode checks that p is a character device on the host and returns
// its numbers.
func hostDeviceNode(t *testing.T, hostRoot, p string) (int64, int64) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(hostRoot, p), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Errorf("device node %s: not a character device on the host (%v)", p, err)
		return -1, -1
	}
	return int64(unix.Major(uint64(st.Rdev))), int64(unix.Minor(uint64(st.Rdev))) //nolint:unconvert // Rdev's type differs by architecture
}

func gpusOf(devices []v1alpha1.Device) []v1alpha1.Device {
	var gpus []v1alpha1.Device
	for _, d := range devices {
		if d.Kind == v1alpha1.DeviceKindNvidiaGPU {
			gpus = append(gpus, d)
		}
	}
	return gpus
}

// emptyDir empties the (private) device-plugin directory between runs: the
// kubelet's checkpoint of the previous run would otherwise be read.
func emptyDir(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}
