package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// TestSchedulerNodeAgentLiveness: the node agent of a real kubelet node (on
// go-nvml's mock of a DGX A100) is stopped. The kubelet drops the class from
// the node's allocatable; the scheduler places no new pod of the class there,
// and says why in FailedScheduling and through kubectl resclass why-pending;
// the pod already running there keeps running. When the agent is back, the
// waiting pod is placed, on a GPU of its own.
func TestSchedulerNodeAgentLiveness(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const node, class = "live-dgx", "e2e-live-gpu"
	if _, err := cluster.ApplyManifest(ctx, "../deploy/node-agent/rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	schedClass(t, ctx, class, req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"))
	kn, err := cluster.AddKubeletNode(ctx, framework.NodeOptions{Name: node})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNodes([]string{node}) })
	dgx, root := mockDGX(t)
	arc, akc := agentClients(t, node)
	cfg := mockGPUAgent(kn, dgx, root, t.TempDir())
	resourceName := corev1.ResourceName(v1alpha1.ResourceNamePrefix + class)
	allocatable := func(what string, want int64) time.Duration {
		t.Helper()
		return waitClassAllocatable(t, ctx, what, node, class, want)
	}
	stop, _ := runAgent(t, ctx, nodeagent.New(cfg, arc, akc))
	allocatable("the agent's endpoint in the node's allocatable", 8)

	ns := newNamespace(t, ctx, nil)
	pods := cluster.Client.CoreV1().Pods(ns)
	if _, err := pods.Create(ctx, gpuPodOn(ns, "running", resclassScheduler, node, class, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	podRunning(t, ctx, ns, "running")

	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	published := func() string {
		nd, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return nd.ResourceVersion
	}
	before := published()

	// The agent stops (SIGTERM): it says so first (AgentServing False), and
	// its endpoint serves on for the shutdown delay, then drains and goes.
	// The kubelet marks the class's devices unhealthy at once; its next status
	// sync (every 2 s on this harness's kubelets, 10 s by default) writes 0.
	// The scheduler does not wait for that: the announcement is enough.
	stopAt := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("agent: %v", err)
	}
	t.Logf("the agent stopped in %v (announced, served for the delay, drained)", time.Since(stopAt).Round(time.Millisecond))
	serving := func() *metav1.Condition {
		nd, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return meta.FindStatusCondition(nd.Status.Conditions, v1alpha1.ConditionAgentServing)
	}
	if c := serving(); c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonAgentShuttingDown {
		t.Fatalf("AgentServing after the agent stopped: %+v, want False/%s", c, v1alpha1.ReasonAgentShuttingDown)
	}

	if _, err := pods.Create(ctx, gpuPodOn(ns, "waiter", resclassScheduler, node, class, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	reason := "node agent not serving class " + class
	t.Logf("FailedScheduling: %s", waitPodEvent(t, ctx, ns, "waiter", "FailedScheduling", reason+" (it is stopping)"))
	t.Logf("the kubelet reported %s as 0 %v after the agent stopped", resourceName, allocatable("the class at 0 in the node's allocatable", 0).Round(time.Millisecond))
	if p, err := pods.Get(ctx, "waiter", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if p.Spec.NodeName != "" {
		t.Fatalf("waiter bound to %s, whose agent is gone", p.Spec.NodeName)
	}

	user := nodeReader(t, ctx)
	out, err := kubectlResclass(t, ctx, user, "why-pending", "waiter", "-n", ns, "-o", "json")
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var pending struct {
		NodesUnread bool `json:"nodesUnread"`
		Nodes       []struct {
			Node, Reason string
			Fits         bool
			Unresolvable bool
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(out), &pending); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	found := false
	for _, n := range pending.Nodes {
		if n.Node == node {
			found = true
			if n.Fits || !n.Unresolvable || !strings.Contains(n.Reason, reason) {
				t.Errorf("why-pending on %s: %+v, want unresolvable %q", node, n, reason)
			}
		}
	}
	if !found || pending.NodesUnread {
		t.Errorf("why-pending: %s\nwant node %s judged, with Nodes read", out, node)
	}
	table, err := kubectlResclass(t, ctx, user, "why-pending", "waiter", "-n", ns)
	if err != nil {
		t.Fatalf("%v: %s", err, table)
	}
	t.Logf("kubectl resclass why-pending waiter:\n%s", table)

	// The pod that was running keeps running: nothing evicts it.
	if p, err := pods.Get(ctx, "running", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		t.Fatalf("running after the agent stopped: %+v", p.Status)
	}

	// The agent is back: it says it serves (AgentServing True, which
	// activates the waiting pods that fit the node), and the kubelet offers
	// the class again (agentBack); the pod is placed once both are seen.
	// boundAssignment waits a minute: without an event that re-queues it,
	// kube-scheduler retries a pod turned away only after 5 minutes.
	runAgent(t, ctx, nodeagent.New(cfg, arc, akc))
	back := time.Now()
	t.Logf("the kubelet reported %s as 8 %v after the agent started again", resourceName, allocatable("the class back in the node's allocatable", 8).Round(time.Millisecond))
	_, got := boundAssignment(t, ctx, ns, "waiter")
	t.Logf("waiter bound %v after the agent started again", time.Since(back).Round(time.Millisecond))
	if published() == before {
		t.Errorf("NodeDevices not written at the agent's stop and start")
	}
	podRunning(t, ctx, ns, "waiter")
	if c := serving(); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("AgentServing with the agent back: %+v, want True", c)
	}
	_, held := boundAssignment(t, ctx, ns, "running")
	for _, id := range got.DeviceIDs() {
		for _, other := range held.DeviceIDs() {
			if id == other {
				t.Errorf("%s given to both running and waiter", id)
			}
		}
	}
}

// nodeReader is a user with the view ClusterRole and the right to read Nodes
// (which view lacks), as an operator running why-pending has.
func nodeReader(t *testing.T, ctx context.Context) string {
	t.Helper()
	const user, role = "e2e-node-reader", "e2e-node-reader"
	c := cluster.Client.RbacV1()
	if _, err := c.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		bg := context.Background()
		_ = c.ClusterRoleBindings().Delete(bg, user, metav1.DeleteOptions{})
		_ = c.ClusterRoleBindings().Delete(bg, user+"-view", metav1.DeleteOptions{})
		_ = c.ClusterRoles().Delete(bg, role, metav1.DeleteOptions{})
	})
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: user, APIGroup: rbacv1.GroupName}}
	for name, ref := range map[string]string{user + "-view": "view", user: role} {
		if _, err := c.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: ref},
			Subjects:   subjects,
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// RBAC is read from the apiserver's informers, and view holds
	// resclass's kinds once the aggregation controller folded them in.
	for _, attrs := range []authorizationv1.ResourceAttributes{
		{Verb: "list", Resource: "nodes"}, {Verb: "list", Resource: "pods"},
		{Verb: "list", Group: v1alpha1.GroupName, Resource: "nodedevices"},
		{Verb: "list", Group: v1alpha1.GroupName, Resource: "resourceclasses"},
	} {
		poll(t, ctx, time.Minute, user+" may "+attrs.Verb+" "+attrs.Resource, func(ctx context.Context) (bool, error) {
			r, err := cluster.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: user, Groups: []string{"system:authenticated"}, ResourceAttributes: &attrs,
			}}, metav1.CreateOptions{})
			return err == nil && r.Status.Allowed, err
		})
	}
	return user
}
