package e2e

// Pod affinity and anti-affinity scoped by namespaceSelector (KEP-2249), as the
// resclass scheduler binary schedules it: the upstream InterPodAffinity plugin
// runs unchanged in it, and these tests hold it to the KEP's semantics on the
// real apiserver, whose namespace labels the scheduler reads from its informer.
//
// Every test gets kwok nodes of its own, named and labeled with a random run id,
// and pins every pod it creates to them: other tests share the cluster and its
// scheduler, and a term's topology (kubernetes.io/hostname) then only ever sees
// this test's pods.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"

	"github.com/resclass/resclass/e2e/framework"
)

// affinityNodeLabel marks the nodes of one test (or sub-benchmark); its value is
// that run's id.
const affinityNodeLabel = "e2e.resclass.io/affinity-run"

// affinityEnv is one test's nodes and the namespaces it created there.
type affinityEnv struct {
	t     *testing.T
	ctx   context.Context
	run   string // random id: node names and the node label's value
	nodes []string
}

// newAffinityEnv creates count kwok nodes named prefix-<random>-i. The random
// part keeps a rerun (-count=2) from recreating a node whose pods from the
// previous run the scheduler may still hold.
func newAffinityEnv(t *testing.T, ctx context.Context, prefix string, count int) *affinityEnv {
	t.Helper()
	diagnoseOnFailure(t, cluster)
	run := prefix + "-" + utilrand.String(5)
	nodes, err := cluster.AddSimulatedNodes(ctx, framework.SimulatedNodes{
		Prefix: run, Count: count, Labels: map[string]string{affinityNodeLabel: run},
	})
	// Registered first, so it runs last: after the pods on these nodes are gone.
	t.Cleanup(func() {
		err := cluster.Client.CoreV1().Nodes().DeleteCollection(context.Background(), metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: affinityNodeLabel + "=" + run})
		if err != nil {
			t.Errorf("deleting nodes %s-*: %v", run, err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return &affinityEnv{t: t, ctx: ctx, run: run, nodes: nodes}
}

// namespace creates a namespace (deleted with the test) whose pods are
// force-deleted first: on kwok nodes a graceful deletion waits for kwok, and
// the nodes are deleted right after.
func (e *affinityEnv) namespace(labels map[string]string) string {
	e.t.Helper()
	ns := newNamespace(e.t, e.ctx, labels)
	e.t.Cleanup(func() {
		zero := int64(0)
		_ = cluster.Client.CoreV1().Pods(ns).DeleteCollection(context.Background(),
			metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	})
	return ns
}

// podSpec is what the tests vary in a pod: everything else is the same small
// pod, pinned to this test's nodes (to one of them if node is set).
type podSpec struct {
	ns, name string
	labels   map[string]string
	affinity *corev1.Affinity
	node     string
}

func (e *affinityEnv) create(s podSpec) {
	e.t.Helper()
	selector := map[string]string{affinityNodeLabel: e.run}
	if s.node != "" {
		selector[corev1.LabelHostname] = s.node
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: s.ns, Labels: s.labels},
		Spec: corev1.PodSpec{
			NodeSelector: selector,
			Affinity:     s.affinity,
			Containers: []corev1.Container{{
				Name:  "main",
				Image: "registry.example/app:1",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("10m"),
				}},
			}},
		},
	}
	if _, err := cluster.Client.CoreV1().Pods(s.ns).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating pod %s/%s: %v", s.ns, s.name, err)
	}
}

// scheduled waits until the pod is bound and returns its node.
func (e *affinityEnv) scheduled(ns, name string) string {
	e.t.Helper()
	var node string
	poll(e.t, e.ctx, 60*time.Second, "pod "+ns+"/"+name+" scheduled", func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		node = p.Spec.NodeName
		return node != "", nil
	})
	return node
}

// unschedulable waits for the scheduler's FailedScheduling Event on the pod,
// whose message must contain why, and checks that the pod is still unbound
// after it: the scheduler has tried and refused, which a quiet wait could not
// tell from not having tried yet.
func (e *affinityEnv) unschedulable(ns, name, why string) {
	e.t.Helper()
	var messages []string
	poll(e.t, e.ctx, 60*time.Second, "FailedScheduling event for "+ns+"/"+name, func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Spec.NodeName != "" {
			return false, fmt.Errorf("bound to %s, want it Pending", p.Spec.NodeName)
		}
		messages, err = failedScheduling(ctx, ns, name)
		return len(messages) > 0, err
	})
	if !slices.ContainsFunc(messages, func(m string) bool { return strings.Contains(m, why) }) {
		e.t.Errorf("pod %s/%s: FailedScheduling %q, want one saying %q", ns, name, messages, why)
	}
	p, err := cluster.Client.CoreV1().Pods(ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	if p.Spec.NodeName != "" {
		e.t.Errorf("pod %s/%s was bound to %s after its FailedScheduling event", ns, name, p.Spec.NodeName)
	}
}

// failedScheduling are the messages of the scheduler's FailedScheduling
// Events on pod ns/name.
func failedScheduling(ctx context.Context, ns, name string) ([]string, error) {
	events, err := cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
		FieldSelector: "reason=FailedScheduling,involvedObject.name=" + name,
	})
	if err != nil {
		return nil, err
	}
	var messages []string
	for _, ev := range events.Items {
		messages = append(messages, ev.Message)
	}
	return messages, nil
}

// judgedOnceSeen creates pods like s, named s.name-1, s.name-2, ..., until the
// scheduler binds one (bound) or refuses one with why (!bound), and returns
// the name of the pod so judged and its node (empty when refused). A namespace relabel reaches the scheduler's
// namespace informer some milliseconds after the patch returns; a pod
// created in between is judged on the old labels and, refused, is not
// retried on the relabel (docs/scheduler.md, "Pod affinity with
// namespaceSelector"). So each pod judged the other way is taken away and the
// next one created, for up to 30 s; then the test fails with what the last
// pod got.
func (e *affinityEnv) judgedOnceSeen(s podSpec, bound bool, why string) (name, node string) {
	e.t.Helper()
	base := s.name
	deadline := time.Now().Add(30 * time.Second)
	for i := 1; ; i++ {
		s.name, node = fmt.Sprintf("%s-%d", base, i), ""
		e.create(s)
		var refused []string
		poll(e.t, e.ctx, 60*time.Second, "pod "+s.ns+"/"+s.name+" bound or refused", func(ctx context.Context) (bool, error) {
			p, err := cluster.Client.CoreV1().Pods(s.ns).Get(ctx, s.name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if node = p.Spec.NodeName; node != "" {
				return true, nil
			}
			refused, err = failedScheduling(ctx, s.ns, s.name)
			return len(refused) > 0, err
		})
		if bound == (node != "") {
			if !bound && !slices.ContainsFunc(refused, func(m string) bool { return strings.Contains(m, why) }) {
				e.t.Fatalf("pod %s/%s: FailedScheduling %q, want one saying %q", s.ns, s.name, refused, why)
			}
			return s.name, node
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("pod %s/%s, 30 s after the relabel: bound to %q, FailedScheduling %q; want bound %v", s.ns, s.name, node, refused, bound)
		}
		e.forceDelete(s.ns, s.name)
		time.Sleep(250 * time.Millisecond)
	}
}

// forceDelete removes a pod at once, so that it no longer counts for the next
// pod's scheduling.
func (e *affinityEnv) forceDelete(ns, name string) {
	e.t.Helper()
	zero := int64(0)
	if err := cluster.Client.CoreV1().Pods(ns).Delete(e.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		e.t.Fatal(err)
	}
}

// hostTerm is a podAffinityTerm on kubernetes.io/hostname over pods labeled
// key=value, in namespaces and in those whose labels match nsLabels (nil: no
// namespaceSelector).
func hostTerm(key, value string, namespaces []string, nsLabels map[string]string) corev1.PodAffinityTerm {
	term := corev1.PodAffinityTerm{
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{key: value}},
		Namespaces:    namespaces,
		TopologyKey:   corev1.LabelHostname,
	}
	if nsLabels != nil {
		term.NamespaceSelector = &metav1.LabelSelector{MatchLabels: nsLabels}
	}
	return term
}

func requiredAffinity(term corev1.PodAffinityTerm) *corev1.Affinity {
	return &corev1.Affinity{PodAffinity: &corev1.PodAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term},
	}}
}

func requiredAntiAffinity(term corev1.PodAffinityTerm) *corev1.Affinity {
	return &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term},
	}}
}

// The upstream InterPodAffinity plugin's Filter reasons.
const (
	reasonAffinity     = "didn't match pod affinity rules"
	reasonAntiAffinity = "anti-affinity rules" // the pod's own, or existing pods'
)

// TestPodAffinityNamespacesUnionNamespaceSelector: a required podAffinity term
// applies to the union of its namespaces list (A) and the namespaces its
// namespaceSelector matches (B): a target in A and a target in B each attract
// the pod to their node, and a target only in an unselected namespace C does
// not, so the pod stays Pending.
func TestPodAffinityNamespacesUnionNamespaceSelector(t *testing.T) {
	ctx := context.Background()
	env := newAffinityEnv(t, ctx, "aff-union", 3)
	nsA := env.namespace(nil)
	nsB := env.namespace(map[string]string{"team": "x"})
	nsC := env.namespace(nil)
	nsProbe := env.namespace(nil) // matched by neither, so the probes' own pods never count
	term := func(target string) corev1.PodAffinityTerm {
		return hostTerm("target", target, []string{nsA}, map[string]string{"team": "x"})
	}

	// One target per node, so each probe's node says which target it followed.
	env.create(podSpec{ns: nsA, name: "target-in-a", labels: map[string]string{"target": "in-a"}, node: env.nodes[0]})
	env.create(podSpec{ns: nsB, name: "target-in-b", labels: map[string]string{"target": "in-b"}, node: env.nodes[1]})
	env.create(podSpec{ns: nsC, name: "target-in-c", labels: map[string]string{"target": "in-c"}, node: env.nodes[2]})
	for i, name := range []string{"target-in-a", "target-in-b", "target-in-c"} {
		if got := env.scheduled([]string{nsA, nsB, nsC}[i], name); got != env.nodes[i] {
			t.Fatalf("%s on %s, want %s", name, got, env.nodes[i])
		}
	}

	env.create(podSpec{ns: nsProbe, name: "follows-a", affinity: requiredAffinity(term("in-a"))})
	if got := env.scheduled(nsProbe, "follows-a"); got != env.nodes[0] {
		t.Errorf("follows-a on %s, want %s with its target in the listed namespace", got, env.nodes[0])
	}
	env.create(podSpec{ns: nsProbe, name: "follows-b", affinity: requiredAffinity(term("in-b"))})
	if got := env.scheduled(nsProbe, "follows-b"); got != env.nodes[1] {
		t.Errorf("follows-b on %s, want %s with its target in the selected namespace", got, env.nodes[1])
	}
	env.create(podSpec{ns: nsProbe, name: "follows-c", affinity: requiredAffinity(term("in-c"))})
	env.unschedulable(nsProbe, "follows-c", reasonAffinity)

	// Control: the same pod schedules as soon as a matching pod appears in a
	// namespace its term covers, so what held it was the namespace scope and not
	// its labels or the nodes. The new pod is in A, the listed namespace: a pod
	// added in B would not requeue it before the scheduler's 5-minute sweep,
	// since the plugin's queueing hint leaves namespaceSelector unevaluated
	// (kubernetes/kubernetes#141953).
	env.create(podSpec{ns: nsA, name: "target-c-in-a", labels: map[string]string{"target": "in-c"}, node: env.nodes[2]})
	if got := env.scheduled(nsProbe, "follows-c"); got != env.nodes[2] {
		t.Errorf("follows-c on %s, want %s once a matching pod is in the listed namespace", got, env.nodes[2])
	}
}

// TestPodAffinitySaaSOnePodPerNodeAcrossCustomers is the KEP's story 1: one pod
// per customer namespace, all with required anti-affinity to the shared workload
// label across every namespace labeled tenant=customer, are placed 1:1 on nodes;
// one more customer's pod finds no node; a pod with the same labels in a
// namespace that is not a customer's is not kept out by them.
func TestPodAffinitySaaSOnePodPerNodeAcrossCustomers(t *testing.T) {
	ctx := context.Background()
	const customers = 4
	env := newAffinityEnv(t, ctx, "aff-saas", customers)
	customer := map[string]string{"tenant": "customer"}
	workload := map[string]string{"app": "saas-worker"}
	anti := requiredAntiAffinity(hostTerm("app", "saas-worker", nil, customer))

	var namespaces []string
	for range customers {
		ns := env.namespace(customer)
		namespaces = append(namespaces, ns)
		env.create(podSpec{ns: ns, name: "worker", labels: workload, affinity: anti})
	}
	placed := map[string]string{}
	for _, ns := range namespaces {
		node := env.scheduled(ns, "worker")
		if other, ok := placed[node]; ok {
			t.Errorf("customers %s and %s share node %s", other, ns, node)
		}
		placed[node] = ns
	}

	// Every namespace holds one pod, so only the cross-namespace scope can keep
	// the fifth customer's pod off all four nodes.
	late := env.namespace(customer)
	env.create(podSpec{ns: late, name: "worker", labels: workload, affinity: anti})
	env.unschedulable(late, "worker", reasonAntiAffinity)

	// Same labels, no anti-affinity of its own (which would select the customer
	// pods and refuse every node): the customers' terms select only
	// tenant=customer namespaces, so theirs do not refuse it either.
	internal := env.namespace(map[string]string{"tenant": "internal"})
	// Every node holds a customer's pod, so it fits only by being exempt.
	env.create(podSpec{ns: internal, name: "worker", labels: workload})
	env.scheduled(internal, "worker")
}

// TestPodAffinityPreferredNamespaceSelector: preferred affinity and preferred
// anti-affinity with a namespaceSelector steer a pod by the pods in the selected
// namespaces only. Every node carries the same load (one aff- and one anti-
// labeled pod), so the only difference between nodes is which namespace those
// pods are in.
func TestPodAffinityPreferredNamespaceSelector(t *testing.T) {
	ctx := context.Background()
	env := newAffinityEnv(t, ctx, "aff-pref", 4)
	selected := map[string]string{"team": "pref"}
	nsSelected := env.namespace(selected)
	nsOther := env.namespace(nil)
	nsProbe := env.namespace(nil)
	const near, away = 1, 2 // the nodes the probes should pick
	for i, node := range env.nodes {
		// The only selected aff pod is on node near; the only anti pod outside
		// the selected namespace is on node away.
		affNS, antiNS := nsOther, nsSelected
		if i == near {
			affNS = nsSelected
		}
		if i == away {
			antiNS = nsOther
		}
		env.create(podSpec{ns: affNS, name: "aff-" + node, labels: map[string]string{"aff": "yes"}, node: node})
		env.create(podSpec{ns: antiNS, name: "anti-" + node, labels: map[string]string{"anti": "yes"}, node: node})
		env.scheduled(affNS, "aff-"+node)
		env.scheduled(antiNS, "anti-"+node)
	}

	env.create(podSpec{ns: nsProbe, name: "prefers-near", affinity: &corev1.Affinity{PodAffinity: &corev1.PodAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
			Weight: 100, PodAffinityTerm: hostTerm("aff", "yes", nil, selected),
		}},
	}}})
	if got := env.scheduled(nsProbe, "prefers-near"); got != env.nodes[near] {
		t.Errorf("prefers-near on %s, want %s, the node of the only aff pod in a selected namespace", got, env.nodes[near])
	}
	env.create(podSpec{ns: nsProbe, name: "prefers-away", affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
			Weight: 100, PodAffinityTerm: hostTerm("anti", "yes", nil, selected),
		}},
	}}})
	if got := env.scheduled(nsProbe, "prefers-away"); got != env.nodes[away] {
		t.Errorf("prefers-away on %s, want %s, the only node without an anti pod in a selected namespace", got, env.nodes[away])
	}
}

// TestNamespaceSelectorLabelChangeAppliesToNextPod: the scheduler reads namespace
// labels when it schedules a pod, so relabeling a namespace changes which pods a
// namespaceSelector term sees for the next pod: a guarded pod in a namespace
// that is not selected lets an anti-affine pod share its node; once the
// namespace is labeled into the selector the next such pod is refused; once the
// label is removed the next one fits again.
func TestNamespaceSelectorLabelChangeAppliesToNextPod(t *testing.T) {
	ctx := context.Background()
	env := newAffinityEnv(t, ctx, "aff-relabel", 1) // one node: each outcome is fits or not
	nsHolder := env.namespace(nil)
	nsProbe := env.namespace(nil)
	env.create(podSpec{ns: nsHolder, name: "guarded", labels: map[string]string{"app": "guarded"}})
	env.scheduled(nsHolder, "guarded")
	anti := requiredAntiAffinity(hostTerm("app", "guarded", nil, map[string]string{"guard": "on"}))
	relabel := func(value *string) {
		t.Helper()
		patch := `{"metadata":{"labels":{"guard":null}}}`
		if value != nil {
			patch = `{"metadata":{"labels":{"guard":"` + *value + `"}}}`
		}
		if _, err := cluster.Client.CoreV1().Namespaces().Patch(ctx, nsHolder, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	env.create(podSpec{ns: nsProbe, name: "before", affinity: anti})
	if got := env.scheduled(nsProbe, "before"); got != env.nodes[0] {
		t.Errorf("before on %s, want %s", got, env.nodes[0])
	}

	// A pod created right after a relabel may still be judged on the old
	// labels (judgedOnceSeen); the next ones are judged on the new.
	on := "on"
	relabel(&on)
	refused, _ := env.judgedOnceSeen(podSpec{ns: nsProbe, name: "while-selected", affinity: anti}, false, reasonAntiAffinity)
	// The scheduler does not requeue pods on namespace label changes: take this
	// one away rather than wait for its periodic retry.
	env.forceDelete(nsProbe, refused)

	relabel(nil)
	if _, got := env.judgedOnceSeen(podSpec{ns: nsProbe, name: "after", affinity: anti}, true, ""); got != env.nodes[0] {
		t.Errorf("after on %s, want %s", got, env.nodes[0])
	}
}
