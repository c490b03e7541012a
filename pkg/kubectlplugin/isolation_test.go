package kubectlplugin

import (
	"bytes"
	"strings"
	"testing"
	"text/tabwriter"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/gpuisolation"
)

func nodeDevices(name string, gpus int, conds ...metav1.Condition) v1alpha1.NodeDevices {
	nd := v1alpha1.NodeDevices{ObjectMeta: metav1.ObjectMeta{Name: name}}
	nd.Status.Summary.GPUs = int32(gpus)
	for i := range gpus {
		nd.Status.Devices = append(nd.Status.Devices, v1alpha1.Device{ID: name + "-gpu-" + string(rune('a'+i)), Kind: "nvidia-gpu", Healthy: true})
	}
	nd.Status.Conditions = conds
	return nd
}

func isolationCondition(status metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: gpuisolation.ConditionType, Status: status, Reason: reason, Message: msg}
}

// TestIsolationNotes: a line for each node whose GPUs are not proven
// isolated, none for the others, and the same note in explain's answer.
func TestIsolationNotes(t *testing.T) {
	nodes := []v1alpha1.NodeDevices{
		nodeDevices("open", 2, isolationCondition(metav1.ConditionFalse, gpuisolation.ReasonRuntimeAcceptsEnvVar, "GPUs not isolated: the NVIDIA container runtime accepts NVIDIA_VISIBLE_DEVICES from unprivileged containers")),
		nodeDevices("hardened", 2, isolationCondition(metav1.ConditionTrue, gpuisolation.ReasonIsolated, "refuses")),
		nodeDevices("old-agent", 1),
		nodeDevices("cpu", 0, isolationCondition(metav1.ConditionUnknown, gpuisolation.ReasonNoGPUs, "no GPUs published")),
		nodeDevices("cpu-old-agent", 0),
		// DRA mode publishes no device in NodeDevices: the condition speaks.
		nodeDevices("dra", 0, isolationCondition(metav1.ConditionUnknown, gpuisolation.ReasonRuntimeConfigNotFound, "GPU isolation cannot be checked: no NVIDIA container runtime configuration")),
	}
	notes := isolationNotes(nodes)
	if len(notes) != 3 || notes["open"].State != gpuisolation.StateUnisolated || notes["old-agent"].Reason != ReasonNotChecked || notes["dra"].State != gpuisolation.StateUnknown {
		t.Fatalf("notes: %+v", notes)
	}

	var out bytes.Buffer
	tb := &table{w: tabwriter.NewWriter(&out, 0, 8, 2, ' ', 0)}
	isolationRows(tb, notes)
	if err := tb.w.Flush(); err != nil {
		t.Fatal(err)
	}
	want := "\nnode dra: GPU isolation cannot be checked: no NVIDIA container runtime configuration\n" +
		"node old-agent: GPU isolation not checked: its node agent publishes no GPUIsolation condition (an agent older than the check)\n" +
		"node open: GPUs not isolated: the NVIDIA container runtime accepts NVIDIA_VISIBLE_DEVICES from unprivileged containers\n"
	if out.String() != want {
		t.Errorf("rows:\n%s\nwant:\n%s", out.String(), want)
	}

	w := &world{nodes: nodes, classes: []v1alpha1.ResourceClass{{
		ObjectMeta: metav1.ObjectMeta{Name: "gpus"},
		Spec: v1alpha1.ResourceClassSpec{ResourceSelector: []v1alpha1.ResourcePropertySelector{{MatchExpressions: []v1alpha1.ResourceSelectorRequirement{
			{Key: "kind", Operator: v1alpha1.ResourceSelectorOpIn, Values: []string{"nvidia-gpu"}},
		}}}},
	}}}
	e, err := explain(w.snapshot(), notes, "gpus", "")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, n := range e.Nodes {
		if _, noted := notes[n.Node]; noted != (n.GPUIsolation != nil) {
			t.Errorf("explain: node %s: %+v, want a note: %v", n.Node, n.GPUIsolation, noted)
		}
		if n.GPUIsolation != nil {
			seen++
		}
	}
	if seen < 2 {
		t.Errorf("explain noted %d nodes of %+v", seen, e.Nodes)
	}
	out.Reset()
	tb = &table{w: tabwriter.NewWriter(&out, 0, 8, 2, ' ', 0)}
	e.table(tb)
	if err := tb.w.Flush(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "node open: GPUs not isolated") || strings.Contains(out.String(), "node hardened:") {
		t.Errorf("explain's table:\n%s", out.String())
	}
	seen = 0
	for _, c := range capacity(w, notes, true) {
		for _, n := range c.Nodes {
			if _, noted := notes[n.Node]; noted != (n.GPUIsolation != nil) {
				t.Errorf("capacity: node %s: %+v, want a note: %v", n.Node, n.GPUIsolation, noted)
			}
			if n.GPUIsolation != nil {
				seen++
			}
		}
	}
	if seen < 2 {
		t.Errorf("capacity --nodes noted %d nodes", seen)
	}
}
