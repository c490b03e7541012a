package inventory

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nic"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
)

func TestLabelsApplied(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"team": "a", nvidiagpu.LabelCount: "8", nic.LabelCount: "2"}}}
	if !labelsApplied(kinds.Builtin, node, map[string]string{nvidiagpu.LabelCount: "8", nic.LabelCount: "2"}) {
		t.Error("same resclass labels, other labels aside: want applied")
	}
	if labelsApplied(kinds.Builtin, node, map[string]string{nvidiagpu.LabelCount: "8"}) {
		t.Error("a resclass label to remove: want not applied")
	}
	if labelsApplied(kinds.Builtin, node, map[string]string{nvidiagpu.LabelCount: "7", nic.LabelCount: "2"}) {
		t.Error("a changed value: want not applied")
	}
}

func TestMergeConditionsKeepsTransitionTime(t *testing.T) {
	then := metav1.NewTime(metav1.Now().Add(-3600e9).Truncate(1e9))
	prev := []metav1.Condition{
		{Type: "A", Status: metav1.ConditionTrue, Reason: "Discovered", Message: "8 GPUs", LastTransitionTime: then},
		{Type: "B", Status: metav1.ConditionTrue, Reason: "Discovered", LastTransitionTime: then},
	}
	next := mergeConditions(prev, []metav1.Condition{
		{Type: "A", Status: metav1.ConditionTrue, Reason: "Discovered", Message: "7 GPUs"},
		{Type: "B", Status: metav1.ConditionFalse, Reason: "Failed"},
	})
	if !next[0].LastTransitionTime.Equal(&then) || next[0].Message != "7 GPUs" {
		t.Errorf("unchanged status: %+v, want the old transition time and the new message", next[0])
	}
	if next[1].LastTransitionTime.Equal(&then) || next[1].LastTransitionTime.IsZero() {
		t.Errorf("changed status: %+v, want a new transition time", next[1])
	}
}
