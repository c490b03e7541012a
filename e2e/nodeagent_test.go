package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	resclassac "github.com/resclass/resclass/pkg/client/applyconfiguration/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	"github.com/resclass/resclass/pkg/discovery/hugepages"
	"github.com/resclass/resclass/pkg/discovery/nic"
	"github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// agentClients are clients with the node agent's identity on node (see
// framework.Cluster.NodeAgentConfig).
func agentClients(t *testing.T, node string) (versioned.Interface, kubernetes.Interface) {
	t.Helper()
	cfg := cluster.NodeAgentConfig(node)
	rc, err := versioned.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rc, kc
}

// TestNodeAgents runs three node agents, each with the node agent's RBAC and
// admission policy, on the real apiserver: a DGX A100 (go-nvml's mock, no NICs), a
// mixed node (the mock GPUs plus this machine's real NICs and hugepage pools) and
// a NIC-only node (this machine, whose NVML is absent).
func TestNodeAgents(t *testing.T) {
	ctx, cancel := agentTest(t, 3*time.Minute)
	defer cancel()
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}

	dgx, mixed := nvmlmock.New(), nvmlmock.New()
	dgxRoot := t.TempDir()
	if err := dgx.WriteSysfs(dgxRoot); err != nil {
		t.Fatal(err)
	}
	nodes := []struct {
		name string
		nvml lib.Interface
		root string
	}{
		{"agent-dgx", dgx, dgxRoot},
		{"agent-mixed", mixed, "/"},
		{"agent-nic", lib.New(lib.WithLibraryPath("/nonexistent/libnvidia-ml.so.1")), "/"},
	}
	agentCtx, stopAgents := context.WithCancel(ctx)
	running := map[string]*nodeagent.Agent{}
	var agents sync.WaitGroup
	t.Cleanup(func() { stopAgents(); agents.Wait() })
	for _, n := range nodes {
		_, err := cluster.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: n.name, Labels: map[string]string{"team": "e2e"},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), n.name, metav1.DeleteOptions{})
		})
		arc, akc := agentClients(t, n.name)
		agent := nodeagent.New(nodeagent.Config{
			NodeName: n.name, HostRoot: n.root,
			Kinds: kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{
				Binding: n.nvml,
				// Recovery must come within the test: a quiet period of seconds.
				Health: nvml.HealthOptions{RecoveryAfter: 2 * time.Second, WaitTimeout: 100 * time.Millisecond},
			}}),
			PollInterval: 200 * time.Millisecond, ResyncInterval: 2 * time.Second,
		}, arc, akc)
		running[n.name] = agent
		agents.Add(1)
		go func() {
			defer agents.Done()
			if err := agent.Run(agentCtx); err != nil {
				t.Errorf("agent on %s: %v", n.name, err)
			}
		}()
	}

	realNICs, err := nic.Discover(nic.Options{HostRoot: "/"})
	if err != nil {
		t.Fatal(err)
	}
	realPools, err := hugepages.Discover(hugepages.Options{HostRoot: "/"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]v1alpha1.DeviceSummary{
		"agent-dgx":   {GPUs: 8},
		"agent-mixed": {GPUs: 8, NICs: int32(len(realNICs)), HugePagePools: int32(len(realPools))},
		"agent-nic":   {NICs: int32(len(realNICs)), HugePagePools: int32(len(realPools))},
	}
	for name, summary := range want {
		nd := waitNodeDevices(t, ctx, rc, name, func(nd *v1alpha1.NodeDevices) bool {
			return nd.Status.Summary == summary
		})
		// Every publish so far was accepted: none went out before the agent
		// knew its GPUs (an empty NVML condition, which the apiserver refuses).
		if failed := publishErrors(t, running[name]); failed != 0 {
			t.Errorf("%s: %v inventory publishes refused by the apiserver, want none", name, failed)
		}
		// The labels follow the NodeDevices write.
		wantLabels := kinds.Builtin.NodeLabels(nd.Status.Devices)
		var node *corev1.Node
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			var err error
			node, err = cluster.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for k, v := range wantLabels {
				if node.Labels[k] != v {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("%s: labels %v, want %v: %v", name, node.Labels, wantLabels, err)
		}
		if len(nd.OwnerReferences) != 1 || nd.OwnerReferences[0].UID != node.UID || nd.OwnerReferences[0].Kind != "Node" {
			t.Errorf("%s: ownerReferences %+v, want the Node %s", name, nd.OwnerReferences, node.UID)
		}
		if node.Labels["team"] != "e2e" {
			t.Errorf("%s: the agent touched a label it does not own: %v", name, node.Labels)
		}
		t.Logf("%s: %+v, labels %v", name, nd.Status.Summary, wantLabels)
	}
	// The NIC-only node says why it has no GPUs.
	nicNode, _ := rc.ResclassV1alpha1().NodeDevices().Get(ctx, "agent-nic", metav1.GetOptions{})
	if c := meta.FindStatusCondition(nicNode.Status.Conditions, nvidiagpu.Condition); c == nil || c.Status != metav1.ConditionFalse || c.Reason != "Unavailable" {
		t.Errorf("agent-nic: %s condition %+v, want False/Unavailable", nvidiagpu.Condition, c)
	}
	dgxNode, _ := cluster.Client.CoreV1().Nodes().Get(ctx, "agent-dgx", metav1.GetOptions{})
	if got := dgxNode.Labels[nvidiagpu.LabelProduct]; got != "Mock-NVIDIA-A100-SXM4-40GB" {
		t.Errorf("agent-dgx: %s=%q", nvidiagpu.LabelProduct, got)
	}

	t.Run("unchanged inventory is not rewritten", func(t *testing.T) {
		before, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, "agent-dgx", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Ten polls and a resync.
		time.Sleep(2500 * time.Millisecond)
		after, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, "agent-dgx", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if before.ResourceVersion != after.ResourceVersion {
			t.Errorf("NodeDevices rewritten without a change: resourceVersion %s → %s", before.ResourceVersion, after.ResourceVersion)
		}
	})

	t.Run("GPU health flips and recovers", func(t *testing.T) {
		gpu := dgx.UUIDs()[3]
		dgx.InjectXID(gpu, 79)
		waitNodeDevices(t, ctx, rc, "agent-dgx", func(nd *v1alpha1.NodeDevices) bool {
			d := findDevice(nd, gpu)
			return d != nil && !d.Healthy && strings.Contains(d.Reason, "XID 79") && nd.Status.Summary.Unhealthy == 1
		})
		waitEvent(t, ctx, "agent-dgx", "DeviceUnhealthy", gpu)
		// No further XID: after the quiet period the GPU answers NVML and recovers.
		waitNodeDevices(t, ctx, rc, "agent-dgx", func(nd *v1alpha1.NodeDevices) bool {
			d := findDevice(nd, gpu)
			return d != nil && d.Healthy && d.Reason == "" && nd.Status.Summary.Unhealthy == 0
		})
		waitEvent(t, ctx, "agent-dgx", "DeviceHealthy", gpu)
	})

	t.Run("deleted NodeDevices is re-created", func(t *testing.T) {
		old, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, "agent-nic", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := rc.ResclassV1alpha1().NodeDevices().Delete(ctx, "agent-nic", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitNodeDevices(t, ctx, rc, "agent-nic", func(nd *v1alpha1.NodeDevices) bool {
			return nd.UID != old.UID && nd.Status.Summary == old.Status.Summary
		})
	})

	t.Run("an agent writes only its own node", func(t *testing.T) {
		arc, akc := agentClients(t, "agent-dgx")
		apply := metav1.ApplyOptions{FieldManager: "intruder", Force: true}
		forbidden := func(what, wantMessage string, err error) {
			t.Helper()
			if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
				t.Errorf("%s: err = %v, want Forbidden", what, err)
			} else if !strings.Contains(err.Error(), wantMessage) {
				t.Errorf("%s: %v, want a message with %q", what, err, wantMessage)
			}
		}
		_, err := arc.ResclassV1alpha1().NodeDevices().ApplyStatus(ctx, resclassac.NodeDevices("agent-nic").
			WithStatus(resclassac.NodeDevicesStatus().WithSummary(resclassac.DeviceSummary().WithGPUs(99))), apply)
		forbidden("status of another node's NodeDevices", "may not write nodedevices agent-nic", err)
		_, err = arc.ResclassV1alpha1().NodeDevices().Apply(ctx, resclassac.NodeDevices("not-a-node").
			WithOwnerReferences(metav1ac.OwnerReference().WithAPIVersion("v1").WithKind("Node").WithName("x").WithUID("y")), apply)
		forbidden("NodeDevices of another name", "may not write nodedevices not-a-node", err)
		_, err = akc.CoreV1().Nodes().Apply(ctx, corev1ac.Node("agent-nic").WithLabels(map[string]string{nvidiagpu.LabelCount: "64"}), apply)
		forbidden("labels of another Node", "may not write nodes agent-nic", err)
		_, err = akc.CoreV1().Nodes().Apply(ctx, corev1ac.Node("agent-dgx").WithLabels(map[string]string{"team": "intruder"}), apply)
		forbidden("a label outside resclass.io/ on its own Node", "resclass.io/ labels only", err)
		err = arc.ResclassV1alpha1().NodeDevices().Delete(ctx, "agent-dgx", metav1.DeleteOptions{})
		forbidden("deleting its NodeDevices (RBAC)", "cannot delete", err)
		_, err = akc.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
		forbidden("listing Secrets (RBAC)", "cannot list", err)

		unbound, _ := agentClients(t, "")
		_, err = unbound.ResclassV1alpha1().NodeDevices().ApplyStatus(ctx, resclassac.NodeDevices("agent-dgx").
			WithStatus(resclassac.NodeDevicesStatus().WithSummary(resclassac.DeviceSummary().WithGPUs(99))), apply)
		forbidden("a token without the node-name claim", "node-name claim is missing", err)

		nd, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, "agent-nic", metav1.GetOptions{})
		if err != nil || nd.Status.Summary.GPUs != 0 {
			t.Errorf("agent-nic after the refused writes: %+v, %v", nd.Status.Summary, err)
		}
	})
}

func findDevice(nd *v1alpha1.NodeDevices, id string) *v1alpha1.Device {
	for i := range nd.Status.Devices {
		if nd.Status.Devices[i].ID == id {
			return &nd.Status.Devices[i]
		}
	}
	return nil
}

// waitNodeDevices waits until the node's NodeDevices satisfies ok.
func waitNodeDevices(t *testing.T, ctx context.Context, rc versioned.Interface, name string, ok func(*v1alpha1.NodeDevices) bool) *v1alpha1.NodeDevices {
	t.Helper()
	var last *v1alpha1.NodeDevices
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		nd, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		last = nd
		return ok(nd), nil
	})
	if err != nil {
		t.Fatalf("NodeDevices %s: %v; last seen: %+v", name, err, last)
	}
	return last
}

// waitEvent waits for an Event of this reason on the Node whose message names
// the device.
func waitEvent(t *testing.T, ctx context.Context, node, reason, device string) {
	t.Helper()
	waitEventOn(t, ctx, metav1.NamespaceAll, "Node", node, reason, device)
}

// waitEventOn waits for an Event of this reason on the object whose message
// contains text, and returns the message.
func waitEventOn(t *testing.T, ctx context.Context, namespace, kind, name, reason, text string) string {
	t.Helper()
	selector := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "reason": reason}.String()
	var seen []string
	var found string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		events, err := cluster.Client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: selector})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, e := range events.Items {
			seen = append(seen, e.Message)
			if strings.Contains(e.Message, text) {
				found = e.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s Event on %s %s with %q: %v; seen %s", reason, kind, name, text, err, fmt.Sprint(seen))
	}
	return found
}

// agentTest begins a test that runs node agents: a context bounded by
// timeout (cancel it when the test returns), the cluster's logs if it fails,
// and the agent's RBAC (deploy/node-agent/rbac.yaml) applied.
func agentTest(t *testing.T, timeout time.Duration) (context.Context, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	diagnoseOnFailure(t, cluster)
	if _, err := cluster.ApplyManifest(ctx, "../deploy/node-agent/rbac.yaml"); err != nil {
		cancel()
		t.Fatal(err)
	}
	return ctx, cancel
}

// mockDGX is go-nvml's mock of a DGX A100 and a host root holding the sysfs
// (PCI, NUMA) of its GPUs, which the agent reads beside NVML.
func mockDGX(t *testing.T) (*nvmlmock.Server, string) {
	t.Helper()
	dgx, root := nvmlmock.New(), t.TempDir()
	if err := dgx.WriteSysfs(root); err != nil {
		t.Fatal(err)
	}
	return dgx, root
}

// publishErrors is the agent's resclass_node_agent_publishes_total{result="error"}.
func publishErrors(t *testing.T, agent *nodeagent.Agent) float64 {
	t.Helper()
	families, err := agent.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "resclass_node_agent_publishes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == "error" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
