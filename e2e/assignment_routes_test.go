package e2e

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
)

// podRoute is what a resource of /api/v1 can do to a pod's metadata.
type podRoute struct {
	// verbs as discovery lists them: a verb added later is a route this
	// classification has not judged.
	verbs []string
	// carries: a write through it can change the pod's labels or
	// annotations, so both assignment policies must match it.
	carries bool
	why     string
}

// podRoutes classifies every resource of /api/v1 that is a pod, a pod's
// subresource or a Binding. TestEveryRouteToPodMetadata fails on one that
// discovery lists and this does not, so a route that Kubernetes adds cannot
// bypass the assignment policies unnoticed. Resources of other kinds write
// their own objects: a controller that makes pods from them (a
// ReplicationController's template) creates the pod through "pods" under
// its own identity.
var podRoutes = map[string]podRoute{
	"pods": {verbs: []string{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}, carries: true,
		why: "the pod itself: create, update and patch write its metadata"},
	"pods/status": {verbs: []string{"get", "patch", "update"}, carries: true,
		why: "its strategy resets spec, ownerReferences and deletionTimestamp but keeps labels, annotations and finalizers"},
	"pods/binding": {verbs: []string{"create"}, carries: true,
		why: "the apiserver merges the Binding's annotations, and its labels (PodTopologyLabelsAdmission), into the pod"},
	"bindings": {verbs: []string{"create"}, carries: true,
		why: "the legacy form of pods/binding (POST /api/v1/namespaces/NS/bindings), served by the same storage"},
	"pods/ephemeralcontainers": {verbs: []string{"get", "patch", "update"},
		why: "its strategy puts back the stored pod's metadata (ResetObjectMetaForStatus): proven below"},
	"pods/resize": {verbs: []string{"get", "patch", "update"},
		why: "its strategy puts back the stored pod's metadata (ResetObjectMetaForStatus), and a change of the containers' list, which it passes on whole, is refused by validation: proven below"},
	"pods/eviction": {verbs: []string{"create"},
		why: "creates an Eviction: the pod is deleted, or not; the Eviction's own metadata never reaches it"},
	"pods/log":         {verbs: []string{"get"}, why: "reads a container's log"},
	"pods/exec":        {verbs: []string{"create", "get"}, why: "a stream to a container through the kubelet; writes nothing to the pod"},
	"pods/attach":      {verbs: []string{"create", "get"}, why: "a stream to a container through the kubelet; writes nothing to the pod"},
	"pods/portforward": {verbs: []string{"create", "get"}, why: "a stream to the pod's ports through the kubelet; writes nothing to the pod"},
	"pods/proxy":       {verbs: []string{"create", "delete", "get", "patch", "update"}, why: "HTTP proxied to the pod's port; writes nothing to the pod"},
}

// writeOperations are the admission operations of a route's write verbs.
func writeOperations(verbs []string) []admissionregistrationv1.OperationType {
	var ops []admissionregistrationv1.OperationType
	if slices.Contains(verbs, "create") {
		ops = append(ops, admissionregistrationv1.Create)
	}
	if slices.Contains(verbs, "update") || slices.Contains(verbs, "patch") {
		ops = append(ops, admissionregistrationv1.Update)
	}
	return ops
}

// policyMatches tells whether the installed policy's matchConstraints match
// the core v1 resource (or subresource) on op.
func policyMatches(p *admissionregistrationv1.ValidatingAdmissionPolicy, resource string, op admissionregistrationv1.OperationType) bool {
	for _, r := range p.Spec.MatchConstraints.ResourceRules {
		if slices.Contains(r.APIGroups, "") && (slices.Contains(r.APIVersions, "v1") || slices.Contains(r.APIVersions, "*")) &&
			slices.Contains(r.Resources, resource) && (slices.Contains(r.Operations, op) || slices.Contains(r.Operations, admissionregistrationv1.OperationAll)) {
			return true
		}
	}
	return false
}

// legacyBind binds pod to node through the legacy bindings resource
// (POST /api/v1/namespaces/NS/bindings), with annotations and labels in the
// Binding.
func legacyBind(ctx context.Context, c kubernetes.Interface, pod *corev1.Pod, node string, annotations, labels map[string]string) error {
	b := &corev1.Binding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Binding"},
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Annotations: annotations, Labels: labels},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}
	return c.CoreV1().RESTClient().Post().Namespace(pod.Namespace).Resource("bindings").Body(b).Do(ctx).Error()
}

func bind(ctx context.Context, c kubernetes.Interface, pod *corev1.Pod, node string, annotations, labels map[string]string) error {
	return c.CoreV1().Pods(pod.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Annotations: annotations, Labels: labels},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{})
}

// patchSubresource merge-patches pod's metadata (and what else body says)
// through subresource.
func patchSubresource(ctx context.Context, c kubernetes.Interface, ns, pod, subresource string, body map[string]any) error {
	data, _ := json.Marshal(body)
	_, err := c.CoreV1().Pods(ns).Patch(ctx, pod, types.MergePatchType, data, metav1.PatchOptions{}, subresource)
	return err
}

func metadataPatch(annotations, labels map[string]any) map[string]any {
	m := map[string]any{}
	if annotations != nil {
		m["annotations"] = annotations
	}
	if labels != nil {
		m["labels"] = labels
	}
	return map[string]any{"metadata": m}
}

// wantForbiddenSaying fails unless err is Forbidden and its message says
// each of parts.
func wantForbiddenSaying(t *testing.T, what string, err error, parts ...string) {
	t.Helper()
	ok := apierrors.IsForbidden(err)
	for _, p := range parts {
		ok = ok && strings.Contains(err.Error(), p)
	}
	if !ok {
		t.Errorf("%s: %v, want Forbidden saying %q", what, err, parts)
	}
}

// TestEveryRouteToPodMetadata: every resource of /api/v1 through which a
// write can reach a pod's metadata is known (discovery, subresources
// included, against podRoutes), both assignment policies match each of
// them, and on the real apiserver, as impersonated identities: a tenant
// with every right on each route, and the user system:kube-scheduler (bound
// to the ClusterRole that the cluster's default scheduler and resclass-dra
// hold), are refused the resclass keys on every route that carries
// metadata; the routes that do not carry it drop the keys; the resclass
// scheduler's identity cannot relabel a pod or annotate it otherwise through
// pods/status or a Binding (legacy or not), and still binds, through the
// legacy resource as well as in both assignmentWrite modes, on a node whose
// zone label the apiserver copies onto its pods.
func TestEveryRouteToPodMetadata(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()

	// 1. Discovery against the classification.
	list, err := cluster.Client.Discovery().ServerResourcesForGroupVersion("v1")
	if err != nil {
		t.Fatal(err)
	}
	served := map[string][]string{}
	for _, r := range list.APIResources {
		if r.Name != "pods" && !strings.HasPrefix(r.Name, "pods/") && r.Kind != "Pod" && r.Kind != "Binding" {
			continue
		}
		verbs := slices.Sorted(slices.Values(r.Verbs))
		served[r.Name] = verbs
		route, ok := podRoutes[r.Name]
		switch {
		case !ok:
			t.Errorf("discovery lists %s (kind %s, verbs %v), which podRoutes does not classify: decide whether a write through it reaches a pod's labels or annotations, and if so add it to both policies of deploy/scheduler/assignment-policy.yaml", r.Name, r.Kind, verbs)
		case !slices.Equal(route.verbs, verbs):
			t.Errorf("discovery lists %s with verbs %v, podRoutes judged %v: judge the new ones", r.Name, verbs, route.verbs)
		}
	}
	for name := range podRoutes {
		if served[name] == nil {
			t.Errorf("podRoutes classifies %s, which this apiserver does not serve: keep the list true", name)
		}
	}

	// 2. Both policies, as installed, match every write of every route
	// that carries metadata. The scheduler's own policy leaves out pod
	// create, which its RBAC does not grant (checked below).
	vaps := cluster.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	writers, err := vaps.Get(ctx, "resclass-assignment-writers", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	schedulerWrites, err := vaps.Get(ctx, "resclass-scheduler-pod-writes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for name, route := range podRoutes {
		if !route.carries {
			continue
		}
		for _, op := range writeOperations(route.verbs) {
			if !policyMatches(writers, name, op) {
				t.Errorf("resclass-assignment-writers does not match %s %s (%s)", op, name, route.why)
			}
			if name == "pods" && op == admissionregistrationv1.Create {
				continue
			}
			if !policyMatches(schedulerWrites, name, op) {
				t.Errorf("resclass-scheduler-pod-writes does not match %s %s (%s)", op, name, route.why)
			}
		}
	}

	// 3. On the apiserver. A GPU node with a zone label: the apiserver's
	// PodTopologyLabels admission copies it onto every Binding to it.
	const class = "e2e-routes-gpu"
	const zone = "e2e-zone-a"
	names, err := cluster.AddSimulatedNodes(ctx, framework.SimulatedNodes{Prefix: "routes-dgx", Count: 1, Profile: "dgx-a100",
		Labels: map[string]string{corev1.LabelTopologyZone: zone}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNodes(names) })
	node := names[0]
	schedClass(t, ctx, class, req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"))
	gpus := nodeGPUs(t, ctx, node)
	ns := newNamespace(t, ctx, nil)
	tc := tenant(t, ctx, ns)
	// Every right on every route that writes to a pod, in its namespace.
	grant(t, ctx, "e2e-tenant-"+ns, ns, rbacv1.PolicyRule{APIGroups: []string{""},
		Resources: []string{"pods/status", "pods/binding", "bindings", "pods/ephemeralcontainers", "pods/resize"},
		Verbs:     []string{"get", "create", "update", "patch"}})
	kubeScheduler, err := kubernetes.NewForConfig(impersonating("system:kube-scheduler", "system:authenticated"))
	if err != nil {
		t.Fatal(err)
	}
	sc, err := cluster.SchedulerClient()
	if err != nil {
		t.Fatal(err)
	}

	// A pod nobody schedules: the Bindings below are the test's.
	unbound, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, gpuPodOn(ns, "unbound", "e2e-bound-by-test", node, class, 1), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	key, value := assignment.AnnotationKey, forged(node, class, gpus[0])
	compatKey := assignment.CompatKey(class, gpus[0])
	for who, c := range map[string]kubernetes.Interface{"a tenant": tc, "system:kube-scheduler": kubeScheduler} {
		wantPolicyDenial(t, who+" binding through pods/binding with an assignment", bind(ctx, c, unbound, node, map[string]string{key: value}, nil), key)
		wantPolicyDenial(t, who+" binding through the legacy bindings with an assignment", legacyBind(ctx, c, unbound, node, map[string]string{key: value}, nil), key)
		wantPolicyDenial(t, who+" binding through the legacy bindings with a seed key", legacyBind(ctx, c, unbound, node, map[string]string{compatKey: "1"}, nil), compatKey)
		wantPolicyDenial(t, who+" writing an assignment through pods/status", patchSubresource(ctx, c, ns, "unbound", "status", metadataPatch(map[string]any{key: value}, nil)), key)
	}
	wantPolicyDenial(t, "a tenant writing an assignment on the pod", annotate(ctx, tc, ns, "unbound", map[string]any{key: value}), key)

	// The routes that drop metadata: admitted or refused, the key never
	// lands. A resize that changes the containers' list is passed on whole
	// by its strategy, so it is tried too.
	for _, try := range []struct {
		subresource string
		body        map[string]any
	}{
		{"ephemeralcontainers", metadataPatch(map[string]any{key: value}, map[string]any{"team": "x"})},
		{"resize", metadataPatch(map[string]any{key: value}, map[string]any{"team": "x"})},
		{"resize", map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: value}},
			"spec": map[string]any{"containers": []any{map[string]any{"name": "c", "image": "registry.example/train:1"}, map[string]any{"name": "d", "image": "registry.example/train:1"}}}}},
	} {
		before, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "unbound", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		err = patchSubresource(ctx, tc, ns, "unbound", try.subresource, try.body)
		after, getErr := cluster.Client.CoreV1().Pods(ns).Get(ctx, "unbound", metav1.GetOptions{})
		if getErr != nil {
			t.Fatal(getErr)
		}
		if !maps.Equal(before.Annotations, after.Annotations) || !maps.Equal(before.Labels, after.Labels) {
			t.Errorf("a tenant's patch through pods/%s (%v) reached the pod's metadata: annotations %v, labels %v", try.subresource, err, after.Annotations, after.Labels)
		}
		t.Logf("pods/%s with metadata: %v; the pod's metadata unchanged", try.subresource, err)
	}

	// The resclass scheduler's identity: no pod create (so its policy need
	// not match one), and through pods/status and Bindings no metadata but
	// the resclass keys and the node's topology labels.
	sar, err := cluster.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               "system:serviceaccount:resclass-system:resclass-scheduler",
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:resclass-system", "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Resource: "pods"},
	}}, metav1.CreateOptions{})
	if err != nil || sar.Status.Allowed {
		t.Errorf("the resclass scheduler may create pods (%v): resclass-scheduler-pod-writes must then match pod create", err)
	}
	const onlyResclass = "the resclass scheduler may change only the resclass annotations"
	wantForbiddenSaying(t, "the scheduler relabelling a pod through pods/status",
		patchSubresource(ctx, sc, ns, "unbound", "status", metadataPatch(nil, map[string]any{"team": "x"})), onlyResclass)
	wantForbiddenSaying(t, "the scheduler annotating a pod through pods/status",
		patchSubresource(ctx, sc, ns, "unbound", "status", metadataPatch(map[string]any{"example.com/other": "x"}, nil)), onlyResclass)
	wantForbiddenSaying(t, "the scheduler adding a finalizer through pods/status",
		patchSubresource(ctx, sc, ns, "unbound", "status", map[string]any{"metadata": map[string]any{"finalizers": []string{"example.com/hold"}}}), onlyResclass)
	wantForbiddenSaying(t, "the scheduler binding through the legacy bindings with another annotation",
		legacyBind(ctx, sc, unbound, node, map[string]string{key: value, "example.com/other": "x"}, nil), "a Binding by the resclass scheduler may carry the resclass annotations only")
	for bindWay, b := range map[string]func(context.Context, kubernetes.Interface, *corev1.Pod, string, map[string]string, map[string]string) error{"pods/binding": bind, "the legacy bindings": legacyBind} {
		wantForbiddenSaying(t, "the scheduler labelling a pod through "+bindWay,
			b(ctx, sc, unbound, node, map[string]string{key: value}, map[string]string{"team": "x"}), "a Binding by the resclass scheduler may carry no labels but")
	}
	// A zone of its choosing: the legacy route has no PodTopologyLabels to
	// overwrite it with the node's.
	wantForbiddenSaying(t, "the scheduler setting a zone label through the legacy bindings",
		legacyBind(ctx, sc, unbound, node, map[string]string{key: value}, map[string]string{corev1.LabelTopologyZone: "elsewhere"}), "a Binding by the resclass scheduler may carry no labels but")
	// What kube-scheduler writes through pods/status (a condition) is its
	// business.
	if err := patchSubresource(ctx, sc, ns, "unbound", "status", map[string]any{"status": map[string]any{"conditions": []any{
		map[string]any{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "e2e"}}}}); err != nil {
		t.Errorf("the scheduler writing a pod's condition through pods/status: %v", err)
	}
	// Its Binding through the legacy resource, with the assignment, binds.
	// (PodTopologyLabels mutates pods/binding only: no zone label here.)
	if err := legacyBind(ctx, sc, unbound, node, map[string]string{key: value}, nil); err != nil {
		t.Fatalf("the scheduler binding through the legacy bindings with an assignment: %v", err)
	}
	pod, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "unbound", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeName != node || pod.Annotations[key] != value {
		t.Errorf("after the scheduler's legacy Binding: node %q, %s %q; want %s and the assignment", pod.Spec.NodeName, key, pod.Annotations[key], node)
	}

	// The resclass scheduler binds in both modes on the zoned node: the
	// zone label that PodTopologyLabels puts on its pods/binding passes its
	// policy and reaches the pod.
	for name, scheduler := range map[string]string{"by-binding": resclassScheduler, "by-prebind": framework.PreBindSchedulerName} {
		if _, err := tc.CoreV1().Pods(ns).Create(ctx, gpuPodOn(ns, name, scheduler, node, class, 1), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod, _ := boundAssignment(t, ctx, ns, name)
		if pod.Labels[corev1.LabelTopologyZone] != zone {
			t.Errorf("%s: labels %v, want the node's zone %s", name, pod.Labels, zone)
		}
	}
}
