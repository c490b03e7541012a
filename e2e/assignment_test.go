package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	deployscheduler "github.com/resclass/resclass/deploy/scheduler"
	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	"github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// policyDenial is how the apiserver words the assignment policy's refusal.
const policyDenial = "only the resclass scheduler may set, change or remove the pod annotation"

// tenant is a client for a user with every right on pods in ns and nothing
// else, through the real apiserver's RBAC (impersonation).
func tenant(t *testing.T, ctx context.Context, ns string) kubernetes.Interface {
	t.Helper()
	user := "e2e-tenant-" + ns
	grant(t, ctx, user, ns, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"},
		Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}})
	c, err := kubernetes.NewForConfig(impersonating(user, "system:authenticated"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// impersonating is the harness's admin config acting as user in groups: what
// the real apiserver's RBAC and admission see is that user.
func impersonating(user string, groups ...string) *rest.Config {
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return cfg
}

// gpuPodOn is a pod of one container "c" requesting n devices of class from
// the scheduler schedulerName, on the node whose hostname label is node.
func gpuPodOn(ns, name, schedulerName, node, class string, n int64) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			SchedulerName: schedulerName, RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptrTo(int64(0)),
			NodeSelector: map[string]string{corev1.LabelHostname: node},
			Containers: []corev1.Container{{Name: "c", Image: "registry.example/train:1", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{corev1.ResourceName(v1alpha1.ResourceNamePrefix + class): *resource.NewQuantity(n, resource.DecimalSI)},
			}}},
		},
	}
}

// forged is an assignment of ids of class to container "c" on node, as a
// tenant would write it.
func forged(node, class string, ids ...string) string {
	a := assignment.Assignment{Node: node, Containers: []assignment.Container{{Name: "c", Classes: map[string][]string{class: ids}}}}
	data, _ := json.Marshal(a)
	return string(data)
}

func annotate(ctx context.Context, c kubernetes.Interface, ns, pod string, annotations map[string]any) error {
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	_, err := c.CoreV1().Pods(ns).Patch(ctx, pod, types.MergePatchType, body, metav1.PatchOptions{})
	return err
}

func wantPolicyDenial(t *testing.T, what string, err error, key string) {
	t.Helper()
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), policyDenial) || !strings.Contains(err.Error(), key) {
		t.Errorf("%s: %v, want Forbidden by the assignment policy naming %s", what, err, key)
	}
}

// waitPodEvent waits for an Event of reason on pod whose message contains
// every part, and returns its message.
func waitPodEvent(t *testing.T, ctx context.Context, ns, pod, reason string, parts ...string) string {
	t.Helper()
	var msg string
	poll(t, ctx, time.Minute, fmt.Sprintf("a %s Event on %s", reason, pod), func(ctx context.Context) (bool, error) {
		evs, err := cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{"involvedObject.name": pod, "reason": reason}.String()})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			all := true
			for _, p := range parts {
				all = all && strings.Contains(e.Message, p)
			}
			if all {
				msg = e.Message
				return true, nil
			}
		}
		return false, nil
	})
	return msg
}

func nodeGPUs(t *testing.T, ctx context.Context, node string) []string {
	t.Helper()
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	poll(t, ctx, time.Minute, "NodeDevices of "+node, func(ctx context.Context) (bool, error) {
		nd, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		ids = nil
		for _, d := range nd.Status.Devices {
			if d.Kind == v1alpha1.DeviceKindNvidiaGPU {
				ids = append(ids, d.ID)
			}
		}
		return len(ids) > 0, nil
	})
	return ids
}

// tenantOnGPUNode adds one simulated DGX node and a class selecting its GPUs,
// and returns the node, its GPUs, a new namespace and a client of a tenant
// holding pod rights in it only.
func tenantOnGPUNode(t *testing.T, ctx context.Context, prefix, class string) (string, []string, string, kubernetes.Interface) {
	t.Helper()
	names, err := cluster.AddSimulatedNodes(ctx, framework.SimulatedNodes{Prefix: prefix, Count: 1, Profile: "dgx-a100"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNodes(names) })
	node := names[0]
	schedClass(t, ctx, class, req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"))
	ns := newNamespace(t, ctx, nil)
	return node, nodeGPUs(t, ctx, node), ns, tenant(t, ctx, ns)
}

// forgedPod is a one-GPU pod created already bound to node, with an
// assignment naming every GPU of it: what a hoarding tenant writes.
func forgedPod(ns, node, class string, gpus []string) *corev1.Pod {
	forge := gpuPodOn(ns, "forge", "", node, class, 1)
	forge.Spec.NodeSelector, forge.Spec.NodeName = nil, node
	forge.Annotations = map[string]string{assignment.AnnotationKey: forged(node, class, gpus...)}
	return forge
}

// TestAssignmentPolicy: with the policy deploy/ installs (the harness applies
// it with the scheduler), a tenant holding every right on pods in its
// namespace cannot forge, inflate, garble or remove an assignment; its other
// pod updates still work; the scheduler still binds and writes assignments in
// both assignmentWrite modes, and may change nothing else of a pod.
func TestAssignmentPolicy(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	const class = "e2e-policy-gpu"
	node, gpus, ns, tc := tenantOnGPUNode(t, ctx, "policy-dgx", class)

	// Forging at create: bound already, with an assignment or a seed key.
	forge := forgedPod(ns, node, class, gpus)
	_, err := tc.CoreV1().Pods(ns).Create(ctx, forge, metav1.CreateOptions{})
	wantPolicyDenial(t, "a tenant creating a pod with an assignment", err, assignment.AnnotationKey)
	compatKey := assignment.CompatKey(class, gpus[0])
	forge.Annotations = map[string]string{compatKey: "1"}
	_, err = tc.CoreV1().Pods(ns).Create(ctx, forge, metav1.CreateOptions{})
	wantPolicyDenial(t, "a tenant creating a pod with a seed key", err, compatKey)

	// The scheduler binds in both modes under the policies: its Binding
	// carries the assignment, or its PreBind patch writes it.
	for name, scheduler := range map[string]string{"by-binding": resclassScheduler, "by-prebind": framework.PreBindSchedulerName} {
		if _, err := tc.CoreV1().Pods(ns).Create(ctx, gpuPodOn(ns, name, scheduler, node, class, 1), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		boundAssignment(t, ctx, ns, name)
	}

	// On a bound pod: inflating, garbling and removing are refused.
	for what, value := range map[string]any{
		"inflating": forged(node, class, gpus...),
		"garbling":  `{"node":`,
		"removing":  nil,
	} {
		err := annotate(ctx, tc, ns, "by-binding", map[string]any{assignment.AnnotationKey: value})
		wantPolicyDenial(t, "a tenant "+what+" the assignment", err, assignment.AnnotationKey)
	}
	pod, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "by-binding", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for key := range pod.Annotations {
		if strings.HasPrefix(key, assignment.CompatKeyPrefix) {
			wantPolicyDenial(t, "a tenant removing a seed key", annotate(ctx, tc, ns, "by-binding", map[string]any{key: nil}), key)
			break
		}
	}
	// An update that keeps the assignment as it is (a PUT of the whole pod)
	// and other metadata changes are the tenant's own business.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := tc.CoreV1().Pods(ns).Get(ctx, "by-binding", metav1.GetOptions{})
		if err != nil {
			return err
		}
		pod.Labels = map[string]string{"team": "ml"}
		pod.Annotations["example.com/note"] = "mine"
		_, err = tc.CoreV1().Pods(ns).Update(ctx, pod, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Errorf("a tenant's update of labels and its own annotation: %v", err)
	}
	if err := annotate(ctx, tc, ns, "by-binding", map[string]any{"example.com/note": nil}); err != nil {
		t.Errorf("a tenant removing its own annotation: %v", err)
	}

	// The scheduler's pod writes may change resclass annotations only.
	sc, err := cluster.SchedulerClient()
	if err != nil {
		t.Fatal(err)
	}
	if err := annotate(ctx, sc, ns, "by-binding", map[string]any{assignment.CompatKeyPrefix + "e2e_probe": "1"}); err != nil {
		t.Errorf("the scheduler writing a resclass key: %v", err)
	}
	body := []byte(`{"spec":{"containers":[{"name":"c","image":"registry.example/evil:1"}]}}`)
	_, err = sc.CoreV1().Pods(ns).Patch(ctx, "by-binding", types.StrategicMergePatchType, body, metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "the resclass scheduler may change only the resclass annotations") {
		t.Errorf("the scheduler changing a pod's image: %v, want Forbidden by resclass-scheduler-pod-writes", err)
	}
	if err := annotate(ctx, sc, ns, "by-binding", map[string]any{"example.com/other": "x"}); !apierrors.IsForbidden(err) {
		t.Errorf("the scheduler writing another annotation: %v, want Forbidden", err)
	}
	// Nor may its Bindings carry anything else.
	plain := gpuPodOn(ns, "plain", "e2e-bound-by-test", node, class, 1)
	created, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, plain, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.BindAsScheduler(ctx, created, node, map[string]string{"example.com/other": "x"}); !apierrors.IsForbidden(err) {
		t.Errorf("a Binding by the scheduler with another annotation: %v, want Forbidden", err)
	}
}

// withoutAssignmentPolicy removes the policies' bindings for the rest of the
// test, as on a cluster that does not install them, and puts them back after
// it. probe is a tenant's dry-run forgery: it tells when the apiserver has
// seen the change (its policy cache follows a watch).
func withoutAssignmentPolicy(t *testing.T, ctx context.Context, probe func(context.Context) error) {
	t.Helper()
	bindings := cluster.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	for _, name := range []string{"resclass-assignment-writers", "resclass-scheduler-pod-writes"} {
		if err := bindings.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if _, err := cluster.ApplyManifestData(ctx, "deploy/scheduler/assignment-policy.yaml", deployscheduler.AssignmentPolicy); err != nil {
			t.Error(err)
			return
		}
		poll(t, ctx, time.Minute, "the assignment policy enforced again", func(ctx context.Context) (bool, error) {
			return apierrors.IsForbidden(probe(ctx)), nil
		})
	})
	poll(t, ctx, time.Minute, "the assignment policy no longer enforced", func(ctx context.Context) (bool, error) {
		return probe(ctx) == nil, nil
	})
}

// TestForgeriesWithoutThePolicy: on a cluster without the policy, a tenant's
// forged assignments do not fool the scheduler. Hoarding: a pod created bound
// with an assignment of every GPU of the node, and a bound pod whose
// assignment is inflated to every GPU, each hold the one GPU they request,
// and the node's other GPUs still schedule.
func TestForgeriesWithoutThePolicy(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	const class = "e2e-hoard-gpu"
	node, gpus, ns, tc := tenantOnGPUNode(t, ctx, "hoard-dgx", class)

	forge := forgedPod(ns, node, class, gpus)
	withoutAssignmentPolicy(t, ctx, func(ctx context.Context) error {
		_, err := tc.CoreV1().Pods(ns).Create(ctx, forge, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})

	if _, err := tc.CoreV1().Pods(ns).Create(ctx, forge, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("forge: %s", waitPodEvent(t, ctx, ns, "forge", "DeviceAssignmentNotBelieved", "(requests)"))

	if _, err := tc.CoreV1().Pods(ns).Create(ctx, gpuPodOn(ns, "hog", resclassScheduler, node, class, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, held := boundAssignment(t, ctx, ns, "hog")
	if err := annotate(ctx, tc, ns, "hog", map[string]any{assignment.AnnotationKey: forged(node, class, gpus...)}); err != nil {
		t.Fatalf("without the policy, the tenant's inflation: %v", err)
	}
	t.Logf("hog: %s", waitPodEvent(t, ctx, ns, "hog", "DeviceAssignmentNotBelieved", "(changed)", class+"="+held.Devices("c", class)[0]))

	// 8 GPUs, 2 held: 6 more pods of 1 GPU schedule, the 7th does not.
	wantRoomFor(t, ctx, tc, ns, node, class, 6)
}

// TestDoubleBookingWithoutThePolicy: the second reproduction, on a
// real kubelet with the node agent. A node's 8 GPUs are held by r1..r8 and r9
// waits; a tenant garbles r1's assignment. The scheduler keeps r1's GPU held
// (it bound r1), so r9 stays Pending until r2 is deleted, and then runs; no
// pod is refused by the agent (UnexpectedAdmissionError).
func TestDoubleBookingWithoutThePolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	diagnoseOnFailure(t, cluster)
	const class, nodeName = "e2e-double-gpu", "double-node"
	agentGPUNode(t, ctx, nodeName, class)

	ns := newNamespace(t, ctx, nil)
	tc := tenant(t, ctx, ns)
	running := func(name string) { podRunning(t, ctx, ns, name) }
	for i := 1; i <= 8; i++ {
		if _, err := tc.CoreV1().Pods(ns).Create(ctx, gpuPodOn(ns, fmt.Sprintf("r%d", i), resclassScheduler, nodeName, class, 1), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 8; i++ {
		running(fmt.Sprintf("r%d", i))
	}
	if _, err := tc.CoreV1().Pods(ns).Create(ctx, gpuPodOn(ns, "r9", resclassScheduler, nodeName, class, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodEvent(t, ctx, ns, "r9", "FailedScheduling", "Insufficient free devices of class "+class)

	probe := gpuPodOn(ns, "probe", "e2e-bound-by-test", nodeName, class, 1)
	probe.Annotations = map[string]string{assignment.AnnotationKey: `{"node":`}
	withoutAssignmentPolicy(t, ctx, func(ctx context.Context) error {
		_, err := tc.CoreV1().Pods(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})
	if err := annotate(ctx, tc, ns, "r1", map[string]any{assignment.AnnotationKey: `{"node":`}); err != nil {
		t.Fatalf("without the policy, the tenant's garbling: %v", err)
	}
	t.Logf("r1: %s", waitPodEvent(t, ctx, ns, "r1", "DeviceAssignmentNotBelieved", "(garbled)"))
	// A pod created after the scheduler saw the garbling is tried against its
	// cache: no room, r1's GPU is still held.
	if _, err := tc.CoreV1().Pods(ns).Create(ctx, gpuPodOn(ns, "r10", resclassScheduler, nodeName, class, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("r10: %s", waitPodEvent(t, ctx, ns, "r10", "FailedScheduling", "Insufficient free devices of class "+class))
	for _, name := range []string{"r9", "r10"} {
		if p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
			t.Errorf("%s bound to %q after r1's assignment was garbled (%v), want Pending", name, p.Spec.NodeName, err)
		}
	}

	// A device really freed: r9 or r10 gets it and runs.
	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, "r2", metav1.DeleteOptions{GracePeriodSeconds: ptrTo(int64(0))}); err != nil {
		t.Fatal(err)
	}
	var next string
	poll(t, ctx, time.Minute, "r9 or r10 bound after r2 left", func(ctx context.Context) (bool, error) {
		for _, name := range []string{"r9", "r10"} {
			p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if p.Spec.NodeName != "" {
				next = name
				return true, nil
			}
		}
		return false, nil
	})
	running(next)
	running("r1")
	pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Status.Reason == "UnexpectedAdmissionError" {
			t.Errorf("%s: %s: %s", p.Name, p.Status.Reason, p.Status.Message)
		}
	}
}

// TestAssignmentsAfterSchedulerRestart: the restart rule on the embedded
// cluster without the policy. Three bound pods of one GPU each on an 8-GPU
// node have their assignments garbled, inflated to every GPU and removed by a
// tenant; the scheduler is restarted and reads them anew. It believes none of
// them (each a Warning Event with the restart's reason), blocks one GPU for
// each (what each requests), and schedules exactly the five left.
func TestAssignmentsAfterSchedulerRestart(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	const class = "e2e-restart-gpu"
	node, gpus, ns, tc := tenantOnGPUNode(t, ctx, "restart-dgx", class)
	if len(gpus) != 8 {
		t.Fatalf("the node publishes %d GPUs, want 8", len(gpus))
	}
	for _, name := range []string{"garbled", "inflated", "removed"} {
		if _, err := tc.CoreV1().Pods(ns).Create(ctx, gpuPodOn(ns, name, resclassScheduler, node, class, 1), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		boundAssignment(t, ctx, ns, name)
	}

	probe := gpuPodOn(ns, "probe", "e2e-bound-by-test", node, class, 1)
	probe.Annotations = map[string]string{assignment.AnnotationKey: `{"node":`}
	withoutAssignmentPolicy(t, ctx, func(ctx context.Context) error {
		_, err := tc.CoreV1().Pods(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})
	for pod, value := range map[string]any{"garbled": `{"node":`, "inflated": forged(node, class, gpus...), "removed": nil} {
		if err := annotate(ctx, tc, ns, pod, map[string]any{assignment.AnnotationKey: value}); err != nil {
			t.Fatalf("without the policy, the tenant's change of %s: %v", pod, err)
		}
	}
	// The running scheduler keeps what it decided, with these reasons.
	waitPodEvent(t, ctx, ns, "inflated", "DeviceAssignmentNotBelieved", "(changed)")
	waitPodEvent(t, ctx, ns, "removed", "DeviceAssignmentNotBelieved", "(removed)")

	if err := cluster.RestartScheduler(ctx); err != nil {
		t.Fatal(err)
	}
	// The new one reads the annotations as they are now: each is seen first and
	// does not fit its pod.
	t.Logf("inflated: %s", waitPodEvent(t, ctx, ns, "inflated", "DeviceAssignmentNotBelieved", "(requests)"))
	t.Logf("removed: %s", waitPodEvent(t, ctx, ns, "removed", "DeviceAssignmentNotBelieved", "(missing)"))

	// 8 GPUs, 3 blocked: 5 more pods of one GPU schedule, the 6th does not.
	wantRoomFor(t, ctx, tc, ns, node, class, 5)
}

// agentGPUNode starts a real kubelet node with the node agent on go-nvml's
// mock of a DGX A100 (8 GPUs) and a class selecting its GPUs, and waits for
// the agent's endpoint of class in the node's allocatable.
func agentGPUNode(t *testing.T, ctx context.Context, nodeName, class string, tweak ...func(*framework.KubeletNode, *nodeagent.Config)) *framework.KubeletNode {
	t.Helper()
	if _, err := cluster.ApplyManifest(ctx, "../deploy/node-agent/rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	schedClass(t, ctx, class, req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"))
	kn, err := cluster.AddKubeletNode(ctx, framework.NodeOptions{Name: nodeName})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNodes([]string{nodeName}) })
	dgx, root := mockDGX(t)
	arc, akc := agentClients(t, nodeName)
	actx, stopAgent := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		cfg := mockGPUAgent(kn, dgx, root, t.TempDir())
		for _, f := range tweak {
			f(kn, &cfg)
		}
		agent := nodeagent.New(cfg, arc, akc)
		if err := agent.Run(actx); err != nil {
			t.Errorf("agent: %v", err)
		}
	}()
	t.Cleanup(func() { stopAgent(); <-done })
	waitClassAllocatable(t, ctx, "the agent's endpoint in the node's allocatable", nodeName, class, 8)
	return kn
}

// mockGPUAgent is the node agent's configuration on kn with go-nvml's mock
// dgx as NVML (its sysfs under root), as the DaemonSet runs it; its
// introspection socket and CDI spec go in dir.
func mockGPUAgent(kn *framework.KubeletNode, dgx *nvmlmock.Server, root, dir string) nodeagent.Config {
	return nodeagent.Config{
		NodeName: kn.Name, HostRoot: root, PluginDir: kn.PluginDir(), WaitForPod: 2 * time.Second,
		IntrospectionSocket: filepath.Join(dir, "agent.sock"),
		Kinds:               kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{Binding: dgx, Health: nvml.HealthOptions{WaitTimeout: 100 * time.Millisecond}}}),
		// As deployed (--pod-resources-socket): the hand-off asks the
		// kubelet which pod it admits (docs/node-agent.md).
		PodResourcesSocket: kn.PodResourcesSocket(),
		// The default device-list strategy, cdi-cri, writes its spec here
		// rather than into the host's /var/run/cdi.
		CDISpecDir: filepath.Join(dir, "cdi"),
	}
}

// waitClassAllocatable waits until node's kubelet reports want devices of
// class in its allocatable, and returns how long that took.
func waitClassAllocatable(t *testing.T, ctx context.Context, what, node, class string, want int64) time.Duration {
	t.Helper()
	start := time.Now()
	poll(t, ctx, time.Minute, what, func(ctx context.Context) (bool, error) {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		q, ok := n.Status.Allocatable[corev1.ResourceName(v1alpha1.ResourceNamePrefix+class)]
		return ok && q.Value() == want, nil
	})
	return time.Since(start)
}

// podRunning waits until pod ns/name runs; a failed pod fails the test with
// its reason (UnexpectedAdmissionError when the agent refuses it).
func podRunning(t *testing.T, ctx context.Context, ns, name string) {
	t.Helper()
	poll(t, ctx, time.Minute, name+" Running", func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Status.Phase == corev1.PodFailed {
			return false, fmt.Errorf("%s failed: %s: %s", name, p.Status.Reason, p.Status.Message)
		}
		return p.Status.Phase == corev1.PodRunning, nil
	})
}

// wantRoomFor checks that node has room for exactly room more 1-GPU pods of
// class: room pods created by tc bind, each to a device of its own, and one
// more stays Pending with the scheduler saying why.
func wantRoomFor(t *testing.T, ctx context.Context, tc kubernetes.Interface, ns, node, class string, room int) {
	t.Helper()
	for i := range room {
		if _, err := tc.CoreV1().Pods(ns).Create(ctx, gpuPodOn(ns, fmt.Sprintf("next-%d", i), resclassScheduler, node, class, 1), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	held := map[string]string{}
	for i := range room {
		name := fmt.Sprintf("next-%d", i)
		_, a := boundAssignment(t, ctx, ns, name)
		for _, id := range a.DeviceIDs() {
			if other, dup := held[id]; dup {
				t.Errorf("%s given to %s and %s", id, other, name)
			}
			held[id] = name
		}
	}
	if _, err := tc.CoreV1().Pods(ns).Create(ctx, gpuPodOn(ns, "one-too-many", resclassScheduler, node, class, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("one-too-many: %s", waitPodEvent(t, ctx, ns, "one-too-many", "FailedScheduling", "Insufficient free devices of class "+class))
	if p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "one-too-many", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Errorf("a pod beyond the %d free GPUs: bound to %q (%v)", room, p.Spec.NodeName, err)
	}
}
