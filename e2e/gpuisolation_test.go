package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	"github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/gpuisolation"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// TestNodeAgentGPUIsolation runs a node agent on go-nvml's mock DGX A100 (8
// GPUs), with the agent's identity on the real apiserver, and plays an
// operator hardening the node's NVIDIA container runtime in the agent's view
// of the host (its --host-root): the configuration as the toolkit's packages
// install it, which accepts NVIDIA_VISIBLE_DEVICES from unprivileged
// containers; then a hardened one; then a FIFO planted in its place. What a
// user sees follows each step: the NodeDevices condition GPUIsolation, one
// Event on the Node per change (not one per pass), the agent's metric, and
// kubectl resclass capacity naming the node while it is not isolated.
func TestNodeAgentGPUIsolation(t *testing.T) {
	ctx, cancel := agentTest(t, 3*time.Minute)
	defer cancel()
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	const node = "isolation-node"
	arc, akc := robustNode(t, ctx, node)
	dgx, root := mockDGX(t)
	config := filepath.Join(root, gpuisolation.PackageRuntimeConfig)
	if err := os.MkdirAll(filepath.Dir(config), 0o755); err != nil {
		t.Fatal(err)
	}
	install := func(testdata string) {
		t.Helper()
		data, err := os.ReadFile(filepath.Join("../pkg/gpuisolation/testdata", testdata))
		if err != nil {
			t.Fatal(err)
		}
		// Written beside and renamed, as a package manager replaces a file:
		// the agent never reads half of it.
		if err := os.WriteFile(config+".new", data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(config+".new", config); err != nil {
			t.Fatal(err)
		}
	}
	install("package-default.toml")

	// The default device-list strategy (cdi-cri) and a fast poll: the file
	// is read at every pass.
	agent := nodeagent.New(nodeagent.Config{
		NodeName: node, HostRoot: root,
		Kinds:        kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{Binding: dgx, Health: nvml.HealthOptions{WaitTimeout: 100 * time.Millisecond}}}),
		PollInterval: 200 * time.Millisecond, ResyncInterval: time.Minute,
	}, arc, akc)
	runAgent(t, ctx, agent)
	user := viewer(t, ctx)

	// step waits for the condition, the Event and the metric of one verdict,
	// and checks what kubectl resclass capacity says of the node.
	step := func(name string, status metav1.ConditionStatus, reason, eventType, event, words string, listed bool) {
		t.Helper()
		nd := waitNodeDevices(t, ctx, rc, node, func(nd *v1alpha1.NodeDevices) bool {
			c := meta.FindStatusCondition(nd.Status.Conditions, gpuisolation.ConditionType)
			return c != nil && c.Status == status && c.Reason == reason
		})
		c := meta.FindStatusCondition(nd.Status.Conditions, gpuisolation.ConditionType)
		t.Logf("%s: %s=%s %s: %s", name, c.Type, c.Status, c.Reason, c.Message)
		if !strings.Contains(c.Message, words) || nd.Status.Summary.GPUs != 8 {
			t.Errorf("%s: message %q lacks %q, or not the 8 GPUs: %+v", name, c.Message, words, nd.Status.Summary)
		}
		msg := waitEventOn(t, ctx, metav1.NamespaceAll, "Node", node, event, words)
		if e := nodeEvent(t, ctx, node, event); e.Type != eventType {
			t.Errorf("%s: Event %s is %s, want %s: %s", name, event, e.Type, eventType, msg)
		}
		state := gpuisolation.StateOf(*c)
		poll(t, ctx, 30*time.Second, name+": resclass_node_agent_gpu_isolation", func(context.Context) (bool, error) {
			for _, s := range gpuisolation.States {
				want := 0.0
				if s == state {
					want = 1
				}
				if metricValue(t, agent, "resclass_node_agent_gpu_isolation", "state", string(s)) != want {
					return false, nil
				}
			}
			return true, nil
		})
		out, err := kubectlResclass(t, ctx, user, "capacity")
		if err != nil {
			t.Fatalf("kubectl resclass capacity: %v\n%s", err, out)
		}
		if strings.Contains(out, "node "+node+": ") != listed {
			t.Errorf("%s: kubectl resclass capacity lists %s: %v, want %v:\n%s", name, node, !listed, listed, out)
		}
	}

	step("the package's defaults", metav1.ConditionFalse, gpuisolation.ReasonRuntimeAcceptsEnvVar,
		corev1.EventTypeWarning, nodeagent.EventGPUsNotIsolated, "accepts NVIDIA_VISIBLE_DEVICES from unprivileged containers", true)

	// Passes go on (five a second) and the verdict holds: its Event is not
	// recorded again (the apiserver would count it up).
	passes := metricValue(t, agent, "resclass_node_agent_publishes_total", "result", "unchanged")
	poll(t, ctx, 30*time.Second, "ten more passes", func(context.Context) (bool, error) {
		return metricValue(t, agent, "resclass_node_agent_publishes_total", "result", "unchanged") >= passes+10, nil
	})
	if e := nodeEvent(t, ctx, node, nodeagent.EventGPUsNotIsolated); e.Count > 1 {
		t.Errorf("%s recorded %d times while the verdict held", nodeagent.EventGPUsNotIsolated, e.Count)
	}

	install("hardened.toml")
	step("hardened", metav1.ConditionTrue, gpuisolation.ReasonIsolated,
		corev1.EventTypeNormal, nodeagent.EventGPUsIsolated, "refuses NVIDIA_VISIBLE_DEVICES from unprivileged containers", false)

	// A FIFO in the file's place would block a plain read for ever: the
	// check refuses it, and the node is not checkable, never isolated.
	if err := os.Remove(config); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(config, 0o644); err != nil {
		t.Fatal(err)
	}
	step("a FIFO", metav1.ConditionUnknown, gpuisolation.ReasonRuntimeConfigUnreadable,
		corev1.EventTypeWarning, nodeagent.EventGPUIsolationUnknown, "a named pipe, not a file", true)
}

// nodeEvent is the Node's Event of this reason (the agent's, one per reason
// here).
func nodeEvent(t *testing.T, ctx context.Context, node, reason string) corev1.Event {
	t.Helper()
	selector := fields.Set{"involvedObject.kind": "Node", "involvedObject.name": node, "reason": reason}.String()
	events, err := cluster.Client.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	if len(events.Items) != 1 {
		t.Fatalf("%d %s Events on Node %s, want 1: %+v", len(events.Items), reason, node, events.Items)
	}
	return events.Items[0]
}

// metricValue is the value of the agent's gauge or counter name with
// label=value (0 when absent).
func metricValue(t *testing.T, agent *nodeagent.Agent, name, label, value string) float64 {
	t.Helper()
	families, err := agent.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetGauge().GetValue() + m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
