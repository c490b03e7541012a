package main

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/e2e/framework/cri"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	"github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// agentNode is the demo's node with the real node agent: go-nvml's DGX A100
// mock stands in for the GPUs, everything else is real (the agent's code, its
// RBAC, the kubelet's device manager).
const agentNode = "gpu-node"

// startNodeAgent starts the agent node: a kubelet, and the node agent with the
// agent's RBAC identity on go-nvml's DGX A100 mock. The agent runs until stop
// is called, which must happen before the cluster stops: its watches would hold
// the apiserver's shutdown.
func startNodeAgent(ctx context.Context, c *framework.Cluster, root string) (kn *framework.KubeletNode, dgx *nvmlmock.Server, stop func(), err error) {
	if _, err := c.ApplyManifest(ctx, filepath.Join(root, "deploy/node-agent/rbac.yaml")); err != nil {
		return nil, nil, nil, err
	}
	if kn, err = c.AddKubeletNode(ctx, framework.NodeOptions{Name: agentNode}); err != nil {
		return nil, nil, nil, err
	}
	dgx, stop, err = runMockAgent(ctx, c, kn, nil)
	return kn, dgx, stop, err
}

// runMockAgent runs the node agent of kubelet node kn on a go-nvml DGX A100
// mock of its own, with the agent's RBAC identity, its CDI spec in the
// cluster's directory (never the host's /var/run/cdi) and tweak's changes to
// its configuration. It returns the mock and the stop, which must come
// before the cluster stops: the agent's watches would hold the apiserver's
// shutdown.
func runMockAgent(ctx context.Context, c *framework.Cluster, kn *framework.KubeletNode, tweak func(*nodeagent.Config)) (dgx *nvmlmock.Server, stop func(), err error) {
	dgx = nvmlmock.New()
	sysfs := filepath.Join(c.Dir, kn.Name+"-sysfs")
	if err := dgx.WriteSysfs(sysfs); err != nil {
		return nil, nil, err
	}
	cfg := c.NodeAgentConfig(kn.Name)
	rc, err := versioned.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	config := nodeagent.Config{
		NodeName: kn.Name, HostRoot: sysfs, PluginDir: kn.PluginDir(), WaitForPod: time.Second,
		Kinds:      kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{Binding: dgx, Health: nvml.HealthOptions{WaitTimeout: 100 * time.Millisecond}}}),
		CDISpecDir: filepath.Join(c.Dir, kn.Name+"-cdi"),
		// Stopped only when the demo ends, when nothing is bound to the
		// node any more: no grace for late pods.
		ShutdownDelay: -1,
	}
	if tweak != nil {
		tweak(&config)
	}
	agent := nodeagent.New(config, rc, kc)
	// The agent's own log would interleave with the narrative.
	agentCtx, cancel := context.WithCancel(klog.NewContext(ctx, logr.Discard()))
	done := make(chan struct{})
	go func() { defer close(done); _ = agent.Run(agentCtx) }()
	return dgx, func() { cancel(); <-done }, nil
}

// agentHandOff shows the agent node's allocatable, writes an assignment on a
// pod as the scheduler will and shows what the container gets; then a pod whose
// assignment the kubelet cannot honour.
func agentHandOff(ctx context.Context, p *printer, c *framework.Cluster, kn *framework.KubeletNode, uuids []string) error {
	p.line("  Node %s: a real kubelet, and the node agent (as the resclass-node-agent", agentNode)
	p.line("  ServiceAccount) on go-nvml's DGX A100 mock. It serves one device-plugin endpoint")
	p.line("  per class that selects its GPUs; the kubelet's allocatable:")
	var node *corev1.Node
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, agentNode, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		node = n
		q := node.Status.Allocatable[v1alpha1.ResourceNamePrefix+"nvidia.high.mem"]
		return q.Value() == 8, nil
	})
	if err != nil {
		return fmt.Errorf("the node agent's endpoints never showed in %s's allocatable: %w", agentNode, err)
	}
	for _, name := range slices.Sorted(maps.Keys(node.Status.Allocatable)) {
		if strings.HasPrefix(string(name), v1alpha1.ResourceNamePrefix) {
			q := node.Status.Allocatable[name]
			p.line("    %s: %s", name, q.String())
		}
	}

	pod := func(name string, gpus ...string) *corev1.Pod {
		a := &assignment.Assignment{Node: agentNode, Containers: []assignment.Container{{Name: "train", Classes: map[string][]string{"nvidia.high.mem": gpus}}}}
		anns, err := assignment.Annotations(a)
		if err != nil {
			panic(err)
		}
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "demo", Annotations: anns},
			Spec: corev1.PodSpec{NodeName: agentNode, RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
				Name: "train", Image: "registry.example/train:1",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNamePrefix + "nvidia.high.mem": resource.MustParse("2")}},
			}}},
		}
	}
	p.line("  demo/train-2 asks for class.resclass.io/nvidia.high.mem: 2 with schedulerName: resclass-scheduler.")
	p.line("  The ResourceClasses plugin picks %s and two of its free GPUs, NUMA-aligned,", agentNode)
	p.line("  and binds the pod with them in the Binding, one write:")
	train2 := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "train-2", Namespace: "demo"},
		Spec: corev1.PodSpec{SchedulerName: "resclass-scheduler", RestartPolicy: corev1.RestartPolicyNever,
			NodeSelector: map[string]string{corev1.LabelHostname: agentNode},
			Containers: []corev1.Container{{
				Name: "train", Image: "registry.example/train:1",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNamePrefix + "nvidia.high.mem": resource.MustParse("2")}},
			}}},
	}
	if _, err := c.Client.CoreV1().Pods("demo").Create(ctx, train2, metav1.CreateOptions{}); err != nil {
		return err
	}
	rec, err := kn.WaitForRecord(ctx, "demo", "train-2", "train")
	if err != nil {
		return err
	}
	scheduled, err := c.Client.CoreV1().Pods("demo").Get(ctx, "train-2", metav1.GetOptions{})
	if err != nil {
		return err
	}
	chosen, found, err := assignment.FromPod(scheduled)
	if err != nil || !found {
		return fmt.Errorf("demo/train-2 runs without a valid assignment (found %v): %w", found, err)
	}
	p.line("    %s: %s", assignment.AnnotationKey, scheduled.Annotations[assignment.AnnotationKey])
	held := chosen.Devices("train", "nvidia.high.mem")
	if v, ok := rec.Env[nvidiagpu.EnvVisibleDevices]; ok || len(rec.CDIDevices) != len(held) {
		return fmt.Errorf("demo/train-2's container got NVIDIA_VISIBLE_DEVICES=%q (set: %v) and %d CDI devices; want no variable and %d CDI names", v, ok, len(rec.CDIDevices), len(held))
	}
	p.line("  The kubelet asked the agent (GetPreferredAllocation, Allocate) and created the container with")
	p.line("  the two GPUs as CDI names (the default --device-list-strategy, cdi-cri), and no")
	p.line("  NVIDIA_VISIBLE_DEVICES, a variable a pod could also set itself:")
	for _, d := range rec.CDIDevices {
		p.line("    CDI device %s", d.GetName())
	}
	p.line("    RESCLASS_DEVICES_NVIDIA_HIGH_MEM=%s", rec.Env["RESCLASS_DEVICES_NVIDIA_HIGH_MEM"])
	p.line("  A pod that asks for no class and sets NVIDIA_VISIBLE_DEVICES=all itself, to reach every")
	p.line("  GPU of the node through NVIDIA's runtime, is refused by the admission policy")
	p.line("  resclass-gpu-isolation (docs/node-agent.md, \"GPU isolation\"), even from the cluster admin:")
	greedy := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "greedy", Namespace: "demo"},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, NodeSelector: map[string]string{corev1.LabelHostname: agentNode},
			Containers: []corev1.Container{{Name: "train", Image: "registry.example/train:1",
				Env: []corev1.EnvVar{{Name: nvidiagpu.EnvVisibleDevices, Value: "all"}}}}},
	}
	_, err = c.Client.CoreV1().Pods("demo").Create(ctx, greedy, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		return fmt.Errorf("a pod setting NVIDIA_VISIBLE_DEVICES=all was not refused: %w", err)
	}
	p.line("    %v", err)

	if err := classStatus(ctx, p, c, "nvidia.high.mem", 2); err != nil {
		return err
	}

	// train-3 names one of train-2's GPUs and one free GPU.
	other := uuids[slices.IndexFunc(uuids, func(u string) bool { return !slices.Contains(held, u) })]
	train3 := pod("train-3", held[0], other)
	p.line("  demo/train-3 is created already bound, with an assignment written by hand naming %s,", short(held[0]))
	p.line("  which train-2 holds. Only the scheduler may write an assignment (admission policy")
	p.line("  resclass-assignment-writers), so the apiserver refuses it, even from the cluster admin:")
	_, err = c.Client.CoreV1().Pods("demo").Create(ctx, train3, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		return fmt.Errorf("a hand-written assignment was not refused: %w", err)
	}
	p.line("    %v", err)
	p.line("  A stale replica of the scheduler (its identity) binds train-3 with that assignment anyway:")
	unbound := train3.DeepCopy()
	unbound.Annotations, unbound.Spec.NodeName, unbound.Spec.SchedulerName = nil, "", "demo-bound-by-hand"
	created, err := c.Client.CoreV1().Pods("demo").Create(ctx, unbound, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	if err := c.BindAsScheduler(ctx, created, agentNode, train3.Annotations); err != nil {
		return err
	}
	var msg string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		evs, err := c.Client.CoreV1().Events("demo").List(ctx, metav1.ListOptions{FieldSelector: fields.Set{"involvedObject.name": "train-3", "reason": "DeviceAssignmentMismatch"}.String()})
		if err != nil || len(evs.Items) == 0 {
			return false, err
		}
		msg = evs.Items[0].Message
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("no DeviceAssignmentMismatch Event on demo/train-3: %w", err)
	}
	got, err := c.Client.CoreV1().Pods("demo").Get(ctx, "train-3", metav1.GetOptions{})
	if err != nil {
		return err
	}
	p.line("  The agent refuses what the scheduler did not assign; kubectl describe pod train-3:")
	p.line("    Warning DeviceAssignmentMismatch: %s", msg)
	p.line("  and the kubelet rejects the pod: phase %s, reason %s.", got.Status.Phase, got.Status.Reason)
	return nil
}

// classStatus waits for the scheduler's status of class to show requested and
// prints it as kubectl get resourceclass does.
func classStatus(ctx context.Context, p *printer, c *framework.Cluster, class string, requested int64) error {
	rc, err := c.Resclass()
	if err != nil {
		return err
	}
	var got *v1alpha1.ResourceClass
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err = rc.ResclassV1alpha1().ResourceClasses().Get(ctx, class, metav1.GetOptions{})
		return err == nil && got.Status.Requested.Value() == requested, nil
	})
	if err != nil {
		return fmt.Errorf("ResourceClass %s status never showed %d requested: %w", class, requested, err)
	}
	p.line("  The scheduler keeps the class's status (kubectl get resourceclass %s):", class)
	p.line("    allocatable %s, requested %s, available %s", got.Status.Allocatable.String(), got.Status.Requested.String(), got.Status.Available.String())
	return nil
}

// short shortens a GPU UUID for the narrative.
func short(uuid string) string {
	if len(uuid) > 12 {
		return uuid[:12] + "…"
	}
	return uuid
}

// runPod creates demo/name on the agent node, its container main asking n
// of class, and waits until the container is made: it returns what the
// runtime got and the assignment the pod runs with.
func runPod(ctx context.Context, c *framework.Cluster, kn *framework.KubeletNode, name, image, class string, n int64) (cri.Record, *assignment.Assignment, error) {
	np := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "demo"},
		Spec: corev1.PodSpec{SchedulerName: "resclass-scheduler", RestartPolicy: corev1.RestartPolicyNever,
			NodeSelector: map[string]string{corev1.LabelHostname: agentNode},
			Containers: []corev1.Container{{
				Name: "main", Image: image,
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceName(v1alpha1.ResourceNamePrefix + class): *resource.NewQuantity(n, resource.DecimalSI)}},
			}}},
	}
	if _, err := c.Client.CoreV1().Pods("demo").Create(ctx, np, metav1.CreateOptions{}); err != nil {
		return cri.Record{}, nil, err
	}
	rec, err := kn.WaitForRecord(ctx, "demo", name, "main")
	if err != nil {
		return cri.Record{}, nil, err
	}
	bound, err := c.Client.CoreV1().Pods("demo").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return cri.Record{}, nil, err
	}
	a, found, err := assignment.FromPod(bound)
	if err != nil || !found {
		return cri.Record{}, nil, fmt.Errorf("demo/%s runs without a valid assignment (found %v): %w", name, found, err)
	}
	return rec, a, nil
}
