package e2e

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/e2e/framework/cri"
	"github.com/resclass/resclass/e2e/framework/node"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/cdispec"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	"github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/introspection"
	"github.com/resclass/resclass/pkg/nodeagent"
	agentv1 "github.com/resclass/resclass/proto/resclass/agent/v1"
)

// Two overlapping classes: every GPU of the mock DGX A100 (40 GB) is in both.
const (
	classHighMem = "e2e-high-mem"
	classAnyGPU  = "e2e-any-gpu"
)

// TestDevicePluginHandOff runs the node agent against a real kubelet (with the
// recording runtime): its device-plugin endpoints register, the kubelet's device
// manager asks them for the devices the scheduler assigned (chosen by the test
// and bound with the scheduler's identity, classPod), and the runtime receives exactly those
// GPUs. Then the kubelet restarts, a GPU fails and recovers, the agent restarts,
// and pods whose assignment is wrong or missing are refused.
func TestDevicePluginHandOff(t *testing.T) {
	ctx, cancel := agentTest(t, 4*time.Minute)
	defer cancel()
	for name, exprs := range map[string][]v1alpha1.ResourceSelectorRequirement{
		classHighMem: {{Key: "kind", Operator: v1alpha1.ResourceSelectorOpIn, Values: []string{"nvidia-gpu"}}, {Key: "memory", Operator: v1alpha1.ResourceSelectorOpGtEq, Values: []string{"30G"}}},
		classAnyGPU:  {{Key: "kind", Operator: v1alpha1.ResourceSelectorOpIn, Values: []string{"nvidia-gpu"}}},
	} {
		schedClass(t, ctx, name, exprs...)
	}

	const nodeName = "gpu-node"
	kn, err := cluster.AddKubeletNode(ctx, framework.NodeOptions{Name: nodeName})
	if err != nil {
		t.Fatal(err)
	}
	dgx, root := mockDGX(t)
	uuids := dgx.UUIDs()
	arc, akc := agentClients(t, nodeName)
	introspectionSocket := filepath.Join(t.TempDir(), "agent.sock")
	cdiDir := t.TempDir()
	startAgent := func() (stop func()) {
		actx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			agent := nodeagent.New(nodeagent.Config{
				NodeName: nodeName, HostRoot: root,
				Kinds: kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{
					Binding: dgx,
					Health:  nvml.HealthOptions{RecoveryAfter: 2 * time.Second, WaitTimeout: 100 * time.Millisecond},
				}}),
				PollInterval: 200 * time.Millisecond, ResyncInterval: 2 * time.Second,
				PluginDir: kn.PluginDir(), WaitForPod: 2 * time.Second, IntrospectionSocket: introspectionSocket, PodResourcesSocket: kn.PodResourcesSocket(),
				// Both, as NVIDIA's plugin allows: the checks below read the
				// env and the CDI names (TestDeviceListStrategies checks
				// each strategy alone).
				DeviceListStrategies: handoff.Strategies{handoff.StrategyEnvVar, handoff.StrategyCDICRI}, CDISpecDir: cdiDir,
			}, arc, akc)
			if err := agent.Run(actx); err != nil {
				t.Errorf("agent: %v", err)
			}
		}()
		return func() { cancel(); wg.Wait() }
	}
	stopAgent := startAgent()
	t.Cleanup(func() { stopAgent() })

	highMem := corev1.ResourceName(v1alpha1.ResourceNamePrefix + classHighMem)
	anyGPU := corev1.ResourceName(v1alpha1.ResourceNamePrefix + classAnyGPU)
	waitAllocatable := func(what string, res corev1.ResourceName, want int64) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			n, err := cluster.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			q := n.Status.Allocatable[res]
			return q.Value() == want, nil
		})
		if err != nil {
			t.Fatalf("%s: allocatable %s never became %d: %v", what, res, want, err)
		}
	}
	waitAllocatable("endpoints registered", highMem, 8)
	waitAllocatable("endpoints registered", anyGPU, 8)

	ns := newNamespace(t, ctx, nil)
	// p1: two GPUs, deliberately not the first two, so that the kubelet's own
	// choice would differ from the scheduler's.
	p1 := classPod(t, ctx, ns, "p1", nodeName, []containerSpec{
		{name: "train", classes: map[string][]string{classHighMem: {uuids[5], uuids[2]}}},
	})
	rec := waitRecord(t, ctx, kn, ns, p1, "train")
	wantGPUs(t, rec, []string{uuids[5], uuids[2]}, []string{uuids[5], uuids[2]})
	if got := rec.Env[handoff.ClassEnv(classHighMem)]; got != uuids[5]+","+uuids[2] {
		t.Errorf("%s=%q", handoff.ClassEnv(classHighMem), got)
	}

	// Kubelet restart: every socket is wiped; the endpoints come back.
	restarted := time.Now()
	if err := kn.RestartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	sockAt := time.Now()
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return kubeletLogLines(kn, restarted, "Got registration request from device plugin", "e2e-") >= 2, nil
	})
	if err != nil {
		t.Fatalf("endpoints did not register with the restarted kubelet: %v", err)
	}
	t.Logf("kubelet restart: both endpoints registered with the new kubelet %v after its socket appeared (restart took %v in all)", time.Since(sockAt).Round(time.Millisecond), time.Since(restarted).Round(time.Millisecond))

	// p2 after the restart: an init container whose GPU the main container
	// reuses (as the kubelet does), and two classes in the main container.
	p2 := classPod(t, ctx, ns, "p2", nodeName, []containerSpec{
		{name: "setup", init: true, classes: map[string][]string{classHighMem: {uuids[0]}}},
		{name: "main", classes: map[string][]string{classHighMem: {uuids[0], uuids[7]}, classAnyGPU: {uuids[3]}}},
	})
	rec = waitRecord(t, ctx, kn, ns, p2, "setup")
	wantGPUs(t, rec, []string{uuids[0]}, []string{uuids[0]})
	rec = waitRecord(t, ctx, kn, ns, p2, "main")
	// NVIDIA_VISIBLE_DEVICES: every GPU of the container, classes in name order.
	wantGPUs(t, rec, []string{uuids[3], uuids[0], uuids[7]}, []string{uuids[0], uuids[7], uuids[3]})
	// p1 kept its devices through the restart.
	if got, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, p1, metav1.GetOptions{}); err != nil || got.Status.Phase != corev1.PodRunning {
		t.Errorf("p1 after the kubelet restart: %v %v", got.Status.Phase, err)
	}

	// A GPU fails: it leaves allocatable, then recovers.
	dgx.InjectXID(uuids[4], 79)
	waitAllocatable("GPU unhealthy", highMem, 7)
	waitAllocatable("GPU unhealthy in the overlapping class", anyGPU, 7)
	waitAllocatable("GPU recovered", highMem, 8)

	// The agent restarts; its state comes back from the kubelet's checkpoint
	// and the pods.
	stopAgent()
	agentRestart := time.Now()
	stopAgent = startAgent()
	// Until its endpoints are back the kubelet holds the devices unhealthy and
	// admits no class pod, as with any device plugin.
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return kubeletLogLines(kn, agentRestart, "Processed device updates for resource", "e2e-", "healthyCount=8") >= 2, nil
	})
	if err != nil {
		t.Fatalf("the restarted agent's endpoints never listed their devices: %v", err)
	}
	t.Logf("agent restart: endpoints serving healthy devices again after %v", time.Since(agentRestart).Round(time.Millisecond))

	// p3's assignment names p1's GPU (a scheduler bug): the kubelet cannot
	// use the preference, picks other GPUs, and the agent refuses them.
	p3 := classPod(t, ctx, ns, "p3", nodeName, []containerSpec{
		{name: "main", classes: map[string][]string{classHighMem: {uuids[5], uuids[6]}}},
	})
	waitPodFailed(t, ctx, ns, p3, "UnexpectedAdmissionError")
	t.Log(waitEventOn(t, ctx, ns, "Pod", p3, handoff.ReasonMismatch, "the resclass scheduler assigned"))

	// p4: no assignment at all (placed by someone else): refused.
	p4 := classPod(t, ctx, ns, "p4", nodeName, []containerSpec{{name: "main", unassigned: 1}})
	waitPodFailed(t, ctx, ns, p4, "UnexpectedAdmissionError")
	t.Log(waitEventOn(t, ctx, ns, "Pod", p4, handoff.ReasonNoAssignment, "must be placed by it"))

	// p5: a right assignment after all that still gets exactly its GPUs.
	p5 := classPod(t, ctx, ns, "p5", nodeName, []containerSpec{
		{name: "main", classes: map[string][]string{classHighMem: {uuids[6], uuids[1]}}},
	})
	rec = waitRecord(t, ctx, kn, ns, p5, "main")
	wantGPUs(t, rec, []string{uuids[6], uuids[1]}, []string{uuids[6], uuids[1]})

	// What `node-agent status` shows: the restarted agent knows p5 from its
	// Allocate, p1 and p2 from the kubelet's checkpoint, and the refusals.
	client, conn, err := introspection.Dial(introspectionSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	allocs, err := client.ListAllocations(ctx, &agentv1.ListAllocationsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, a := range allocs.GetAllocations() {
		seen = append(seen, a.GetPodName()+"/"+a.GetContainer()+"/"+a.GetClassName()+"="+a.GetOutcome())
	}
	slices.Sort(seen)
	want := []string{
		"p1/train/" + classHighMem + "=allocated",
		"p2/main/" + classAnyGPU + "=allocated", "p2/main/" + classHighMem + "=allocated", "p2/setup/" + classHighMem + "=allocated",
		"p3/main/" + classHighMem + "=refused", "p4//" + classHighMem + "=refused",
		"p5/main/" + classHighMem + "=allocated",
	}
	if !slices.Equal(seen, want) {
		t.Errorf("allocations the agent reports:\n got %v\nwant %v", seen, want)
	}
	devs, err := client.ListDevices(ctx, &agentv1.ListDevicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if d := devs.GetDevices(); len(d) != 8 || !slices.Equal(d[0].GetClasses(), []string{classAnyGPU, classHighMem}) {
		t.Errorf("devices the agent reports: %v", d)
	}

	// No GPU went to two running containers.
	records, err := kn.Records()
	if err != nil {
		t.Fatal(err)
	}
	holder := map[string]string{}
	for _, r := range records {
		if r.Namespace != ns || r.Container == "setup" {
			continue
		}
		for _, id := range strings.Split(r.Env["NVIDIA_VISIBLE_DEVICES"], ",") {
			if prev, ok := holder[id]; ok {
				t.Errorf("GPU %s given to %s and %s/%s", id, prev, r.Pod, r.Container)
			}
			holder[id] = r.Pod + "/" + r.Container
		}
	}
}

type containerSpec struct {
	name    string
	init    bool
	classes map[string][]string // class -> assigned GPUs
	// unassigned requests this many GPUs of classHighMem with no assignment.
	unassigned int64
}

// classPod creates a pod and binds it to nodeName with the containers'
// assignment in the Binding, as the scheduler binds it and under its identity:
// only the scheduler may write an assignment (deploy/scheduler/assignment-policy.yaml).
// No scheduler serves the pod's schedulerName, so the test's choice of devices
// is the only one.
func classPod(t *testing.T, ctx context.Context, ns, name, nodeName string, containers []containerSpec) string {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			SchedulerName: "e2e-bound-by-test", RestartPolicy: corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptrTo(int64(0)),
		},
	}
	a := &assignment.Assignment{Node: nodeName}
	for _, c := range containers {
		limits := corev1.ResourceList{}
		for class, ids := range c.classes {
			limits[corev1.ResourceName(v1alpha1.ResourceNamePrefix+class)] = *resource.NewQuantity(int64(len(ids)), resource.DecimalSI)
		}
		if c.unassigned > 0 {
			limits[corev1.ResourceName(v1alpha1.ResourceNamePrefix+classHighMem)] = *resource.NewQuantity(c.unassigned, resource.DecimalSI)
		}
		spec := corev1.Container{Name: c.name, Image: "registry.example/cuda:12", Resources: corev1.ResourceRequirements{Limits: limits}}
		if c.init {
			spec.Env = []corev1.EnvVar{{Name: cri.EnvExitCode, Value: "0"}}
			p.Spec.InitContainers = append(p.Spec.InitContainers, spec)
		} else {
			p.Spec.Containers = append(p.Spec.Containers, spec)
		}
		if len(c.classes) > 0 {
			a.Containers = append(a.Containers, assignment.Container{Name: c.name, Init: c.init, Classes: c.classes})
		}
	}
	var anns map[string]string
	if len(a.Containers) > 0 {
		var err error
		if anns, err = assignment.Annotations(a); err != nil {
			t.Fatal(err)
		}
	}
	created, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.BindAsScheduler(ctx, created, nodeName, anns); err != nil {
		t.Fatal(err)
	}
	return name
}

func ptrTo[T any](v T) *T { return &v }

// waitRecord waits for the runtime's CreateContainer of pod/container.
func waitRecord(t *testing.T, ctx context.Context, kn *framework.KubeletNode, ns, pod, container string) cri.Record {
	t.Helper()
	r, err := kn.WaitForRecord(ctx, ns, pod, container)
	if err != nil {
		p, _ := cluster.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		t.Fatalf("%v\npod status: %+v", err, p.Status)
	}
	return r
}

// wantGPUs checks the GPUs a container got: NVIDIA_VISIBLE_DEVICES (visible, in
// order) and the CDI devices (cdi, as a set).
func wantGPUs(t *testing.T, r cri.Record, visible, cdi []string) {
	t.Helper()
	if got := r.Env["NVIDIA_VISIBLE_DEVICES"]; got != strings.Join(visible, ",") {
		t.Errorf("%s/%s: NVIDIA_VISIBLE_DEVICES=%q, want %q", r.Pod, r.Container, got, strings.Join(visible, ","))
	}
	var got []string
	for _, d := range r.CDIDevices {
		got = append(got, d.Name)
	}
	var want []string
	for _, id := range cdi {
		want = append(want, cdispec.DeviceName(id))
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s/%s: CDI devices %v, want %v", r.Pod, r.Container, got, want)
	}
}

func waitPodFailed(t *testing.T, ctx context.Context, ns, pod, reason string) {
	t.Helper()
	var last *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = p
		return p.Status.Phase == corev1.PodFailed && p.Status.Reason == reason, nil
	})
	if err != nil {
		t.Fatalf("pod %s not Failed with %s: %v\nstatus: %+v", pod, reason, err, last.Status)
	}
	t.Logf("%s: %s: %s", pod, last.Status.Reason, last.Status.Message)
}

// kubeletLogLines counts the kubelet's log lines written at or after since that
// contain every one of substrings.
func kubeletLogLines(kn *framework.KubeletNode, since time.Time, substrings ...string) int {
	f, err := os.Open(filepath.Join(kn.Dir, node.KubeletLog))
	if err != nil {
		return 0
	}
	defer func() { _ = f.Close() }()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
lines:
	for sc.Scan() {
		line := sc.Text()
		for _, sub := range substrings {
			if !strings.Contains(line, sub) {
				continue lines
			}
		}
		// klog header: Lmmdd hh:mm:ss.uuuuuu
		header := strings.Fields(line)
		if len(header) < 2 || len(header[0]) < 5 {
			continue
		}
		ts, err := time.ParseInLocation("0102 15:04:05.000000", header[0][1:]+" "+header[1], time.Local)
		if err != nil {
			continue
		}
		if !ts.AddDate(since.Year(), 0, 0).Before(since) {
			n++
		}
	}
	return n
}
