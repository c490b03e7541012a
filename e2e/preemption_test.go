package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/cdispec"
)

// priorityLevel creates a PriorityClass of value whose pods preempt as policy
// says (removed when the test ends).
func priorityLevel(t *testing.T, ctx context.Context, name string, value int32, policy corev1.PreemptionPolicy) {
	t.Helper()
	_, err := cluster.Client.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value, PreemptionPolicy: &policy,
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.SchedulingV1().PriorityClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// prioritized is a pod of one container "c" asking n devices of class on the
// node, with a priority class and labels.
func prioritized(ns, name, node, class, priority string, n int64, labels map[string]string) *corev1.Pod {
	p := gpuPodOn(ns, name, resclassScheduler, node, class, n)
	p.Spec.PriorityClassName, p.Labels = priority, labels
	return p
}

// slowExit is a finalizer the test holds on its victims: a simulated node
// ends a deleted pod at once, where a kubelet takes the pod's grace period,
// and a victim that vanishes within milliseconds races the scheduler's own
// bookkeeping of the preemption (upstream's, for any resource).
const slowExit = "e2e.resclass.io/slow-exit"

// releaseTerminating removes slowExit from every pod of ns being deleted, and
// returns their names.
func releaseTerminating(t *testing.T, ctx context.Context, ns string) []string {
	t.Helper()
	list, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil || !slices.Contains(p.Finalizers, slowExit) {
			continue
		}
		out = append(out, p.Name)
		patch := `{"metadata":{"finalizers":null}}`
		if _, err := cluster.Client.CoreV1().Pods(ns).Patch(ctx, p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	slices.Sort(out)
	return out
}

// TestClassPreemption: a node full of low-priority class pods, some protected
// by a PodDisruptionBudget and some holding their GPUs through another class
// that selects the same devices. An equal-priority pod and a high-priority
// pod that may not preempt wait; a high-priority pod preempts the fewest
// unprotected pods and is bound to exactly the devices they held; a
// lower-priority pod created meanwhile does not take them.
func TestClassPreemption(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	const gpuClass, bigClass = "e2e-pre-gpu", "e2e-pre-big"
	node, gpus, ns, _ := tenantOnGPUNode(t, ctx, "pre-dgx", gpuClass)
	schedClass(t, ctx, bigClass, req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"), req("memory", v1alpha1.ResourceSelectorOpGtEq, "1Gi"))
	if len(gpus) != 8 {
		t.Fatalf("the node publishes %d GPUs, want 8", len(gpus))
	}
	priorityLevel(t, ctx, "e2e-pre-low", 100, corev1.PreemptLowerPriority)
	priorityLevel(t, ctx, "e2e-pre-high", 1000, corev1.PreemptLowerPriority)
	priorityLevel(t, ctx, "e2e-pre-high-never", 1000, corev1.PreemptNever)
	pods := cluster.Client.CoreV1().Pods(ns)

	// The node full: four pods hold their GPUs through the overlapping class
	// (unprotected), four through the class the preemptor asks, under a PDB
	// that allows no disruption.
	if _, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "protected"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptrTo(intstr.FromInt32(4)),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"protected": "true"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	held := map[string][]string{} // pod -> devices
	t.Cleanup(func() {
		for _, name := range slices.Sorted(maps.Keys(held)) {
			_ = pods.Delete(context.Background(), name, metav1.DeleteOptions{})
		}
		releaseTerminating(t, context.Background(), ns)
	})
	for i := range 8 {
		name, class, labels := fmt.Sprintf("big-%d", i), bigClass, map[string]string(nil)
		if i >= 4 {
			name, class, labels = fmt.Sprintf("protected-%d", i), gpuClass, map[string]string{"protected": "true"}
		}
		low := prioritized(ns, name, node, class, "e2e-pre-low", 1, labels)
		low.Finalizers = []string{slowExit}
		if _, err := pods.Create(ctx, low, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		_, a := boundAssignment(t, ctx, ns, name)
		held[name] = a.Devices("c", class)
	}
	poll(t, ctx, time.Minute, "the PDB to allow no disruption", func(ctx context.Context) (bool, error) {
		pdb, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "protected", metav1.GetOptions{})
		return err == nil && pdb.Status.ObservedGeneration == pdb.Generation && pdb.Status.CurrentHealthy == 4 && pdb.Status.DisruptionsAllowed == 0, err
	})

	// Neither an equal priority nor preemptionPolicy: Never preempts.
	never := prioritized(ns, "never", node, gpuClass, "e2e-pre-high-never", 1, nil)
	for _, p := range []*corev1.Pod{prioritized(ns, "peer", node, gpuClass, "e2e-pre-low", 1, nil), never} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s", p.Name, waitPodEvent(t, ctx, ns, p.Name, "FailedScheduling", "Insufficient free devices of class "+gpuClass))
	}
	alive := func() []string {
		t.Helper()
		list, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range list.Items {
			if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
				out = append(out, p.Name)
			}
		}
		slices.Sort(out)
		return out
	}
	if got := alive(); len(got) != 8 {
		t.Fatalf("after the equal-priority and the never-preempting pod: bound %v, want the 8 low pods", got)
	}
	// Both go before the preemption: at equal priority they would compete
	// with the preemptor for the freed devices, as upstream has it.
	for _, name := range []string{"peer", "never"} {
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// The high-priority pod asks 2 GPUs of gpuClass: two of the unprotected
	// big-* pods go, although they hold their GPUs through bigClass.
	if _, err := pods.Create(ctx, prioritized(ns, "high", node, gpuClass, "e2e-pre-high", 2, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, time.Minute, "high nominated to the node", func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, "high", metav1.GetOptions{})
		return err == nil && (p.Status.NominatedNodeName == node || p.Spec.NodeName == node), err
	})
	poll(t, ctx, time.Minute, "the victims terminating", func(ctx context.Context) (bool, error) {
		list, err := pods.List(ctx, metav1.ListOptions{})
		return err == nil && slices.ContainsFunc(list.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil }), err
	})
	// A lower pod created while the victims leave must not take their GPUs,
	// neither while they terminate nor once they are gone.
	if _, err := pods.Create(ctx, prioritized(ns, "thief", node, gpuClass, "e2e-pre-low", 1, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodEvent(t, ctx, ns, "thief", "FailedScheduling", "Insufficient free devices of class "+gpuClass)
	// The victims leave (the last one may still be being deleted).
	var victims []string
	poll(t, ctx, time.Minute, "high bound once its victims are gone", func(ctx context.Context) (bool, error) {
		victims = append(victims, releaseTerminating(t, ctx, ns)...)
		p, err := pods.Get(ctx, "high", metav1.GetOptions{})
		return err == nil && p.Spec.NodeName != "", err
	})
	slices.Sort(victims)
	_, a := boundAssignment(t, ctx, ns, "high")
	got := a.Devices("c", gpuClass)
	var freed []string
	for _, name := range victims {
		freed = append(freed, held[name]...)
	}
	slices.Sort(freed)
	slices.Sort(got)
	t.Logf("high got %v; victims %v, which held %v", got, victims, freed)
	if len(victims) != 2 || !slices.Equal(got, freed) {
		t.Errorf("high got %v after preempting %v (which held %v): want the fewest victims (2) and exactly their devices", got, victims, freed)
	}
	for _, v := range victims {
		if v[:4] != "big-" {
			t.Errorf("victim %s is protected by the PDB while unprotected pods could go", v)
		}
	}
	if p, err := pods.Get(ctx, "thief", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Errorf("thief bound to %q (%v), want Pending: the node is full", p.Spec.NodeName, err)
	}
}

// TestPreemptionHandOff: on a real kubelet with the node agent, a
// high-priority pod preempts one of eight low-priority pods holding the
// node's GPUs and runs on the GPU it freed: the agent hands it over, and no
// pod is refused at admission.
func TestPreemptionHandOff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	diagnoseOnFailure(t, cluster)
	const class, nodeName = "e2e-preempt-gpu", "preempt-node"
	kn := agentGPUNode(t, ctx, nodeName, class)
	priorityLevel(t, ctx, "e2e-handoff-low", 100, corev1.PreemptLowerPriority)
	priorityLevel(t, ctx, "e2e-handoff-high", 1000, corev1.PreemptLowerPriority)
	ns := newNamespace(t, ctx, nil)
	pods := cluster.Client.CoreV1().Pods(ns)

	held := map[string]string{} // device -> pod
	for i := range 8 {
		name := fmt.Sprintf("low-%d", i)
		if _, err := pods.Create(ctx, prioritized(ns, name, nodeName, class, "e2e-handoff-low", 1, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		_, a := boundAssignment(t, ctx, ns, name)
		held[a.Devices("c", class)[0]] = name
	}
	for i := range 8 {
		podRunning(t, ctx, ns, fmt.Sprintf("low-%d", i))
	}
	if _, err := pods.Create(ctx, prioritized(ns, "high", nodeName, class, "e2e-handoff-high", 1, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	podRunning(t, ctx, ns, "high")
	_, a := boundAssignment(t, ctx, ns, "high")
	device := a.Devices("c", class)[0]
	victim := held[device]
	if _, err := pods.Get(ctx, victim, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("high runs on %s, held by %s, which still exists (%v)", device, victim, err)
	}
	// What reached the container: the freed GPU, through the agent.
	rec := waitRecord(t, ctx, kn, ns, "high", "c")
	// The default device-list strategy, cdi-cri: the GPU's CDI name.
	if len(rec.CDIDevices) != 1 || rec.CDIDevices[0].GetName() != cdispec.DeviceName(device) {
		t.Errorf("high's container got CDI devices %v, want %s", rec.CDIDevices, cdispec.DeviceName(device))
	}
	list, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	alive := 0
	for _, p := range list.Items {
		if p.Status.Reason == "UnexpectedAdmissionError" {
			t.Errorf("%s: %s: %s", p.Name, p.Status.Reason, p.Status.Message)
		}
		if p.DeletionTimestamp == nil {
			alive++
		}
	}
	if alive != 8 {
		t.Errorf("%d pods left, want 7 low ones and high: one victim only", alive)
	}
	t.Logf("high runs on %s, which %s held", device, victim)
	t.Logf("%s: %s", victim, waitPodEvent(t, ctx, ns, victim, "DevicesPreempted", class+"="+device, nodeName))
}
