package kubectlplugin

import (
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/gpuisolation"
)

// ReasonNotChecked is an IsolationNote's reason for a node with GPUs whose
// agent publishes no GPUIsolation condition (one older than the check).
const ReasonNotChecked = "NotChecked"

// IsolationNote is a node whose GPUs are not proven isolated: its node agent
// found the NVIDIA container runtime accepting NVIDIA_VISIBLE_DEVICES from
// unprivileged containers, or could not check it (the NodeDevices condition
// GPUIsolation, docs/node-agent.md "GPU isolation"). There, a pod may reach
// GPUs the scheduler did not assign it, whatever explain and capacity count.
type IsolationNote struct {
	// State is unisolated or unknown (gpuisolation.State).
	State   gpuisolation.State `json:"state"`
	Reason  string             `json:"reason"`
	Message string             `json:"message"`
}

// isolationNotes are the notes of the nodes not proven isolated, by node
// name. A node that publishes no GPU and whose runtime proves nothing either
// way has none: there is nothing to warn about.
func isolationNotes(nodes []v1alpha1.NodeDevices) map[string]IsolationNote {
	notes := map[string]IsolationNote{}
	for i := range nodes {
		nd := &nodes[i]
		c := meta.FindStatusCondition(nd.Status.Conditions, gpuisolation.ConditionType)
		if c == nil {
			if nd.Status.Summary.GPUs > 0 {
				notes[nd.Name] = IsolationNote{State: gpuisolation.StateUnknown, Reason: ReasonNotChecked,
					Message: "GPU isolation not checked: its node agent publishes no " + gpuisolation.ConditionType + " condition (an agent older than the check)"}
			}
			continue
		}
		switch s := gpuisolation.StateOf(*c); s {
		case gpuisolation.StateUnisolated, gpuisolation.StateUnknown:
			notes[nd.Name] = IsolationNote{State: s, Reason: c.Reason, Message: c.Message}
		}
	}
	return notes
}

// isolationRows prints one line per node of notes, by name: what the
// condition says, which begins with "GPUs not isolated" or "GPU isolation
// cannot be checked".
func isolationRows(t *table, notes map[string]IsolationNote) {
	if len(notes) == 0 {
		return
	}
	t.row("")
	for _, node := range slices.Sorted(maps.Keys(notes)) {
		t.row("node %s: %s", node, notes[node].Message)
	}
}

// note is the node's note, nil when it has none (for the JSON answers).
func note(notes map[string]IsolationNote, node string) *IsolationNote {
	n, ok := notes[node]
	if !ok {
		return nil
	}
	return &n
}
