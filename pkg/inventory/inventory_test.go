package inventory

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned/fake"

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

// An informer delivers the agent's own write late. Publishing the same
// inventory against that older copy must not write it again: with the old copy's
// conditions, every condition would get a new transition time.
func TestPublishDoesNotRewriteOverALaggingInformer(t *testing.T) {
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "node-uid"}}
	rc, writes := applyRecorder(t)
	pub := &Publisher{Resclass: rc, Kube: kubefake.NewClientset(node), Node: node}
	status := v1alpha1.NodeDevicesStatus{
		Summary:    v1alpha1.DeviceSummary{GPUs: 1},
		Conditions: []metav1.Condition{{Type: "GPUsDiscovered", Status: metav1.ConditionTrue, Reason: "Discovered", Message: "1 GPU"}},
	}
	wrote, err := pub.Publish(ctx, nil, status)
	if err != nil || !wrote || len(*writes) != 2 {
		t.Fatalf("first publish: wrote %v, %v, writes %v; want the object and its status", wrote, err, *writes)
	}
	first := (*writes)[1]

	// The informer still holds the object as the create left it: no status.
	stale := (*writes)[0].DeepCopy()
	time.Sleep(1100 * time.Millisecond) // a new transition time would differ
	if wrote, err := pub.Publish(ctx, stale, status); err != nil || wrote {
		t.Errorf("same inventory over a lagging copy: wrote %v, %v; want no write", wrote, err)
	}
	// Once the informer catches up, nothing is written either.
	if wrote, err := pub.Publish(ctx, first.DeepCopy(), status); err != nil || wrote {
		t.Errorf("same inventory over the written copy: wrote %v, %v; want no write", wrote, err)
	}

	// A copy newer than the write carries someone else's change: it is undone.
	newer := first.DeepCopy()
	newer.Status = v1alpha1.NodeDevicesStatus{}
	newer.ResourceVersion = "100"
	if wrote, err := pub.Publish(ctx, newer, status); err != nil || !wrote {
		t.Errorf("same inventory over someone else's newer change: wrote %v, %v; want a write", wrote, err)
	}
	// A copy of another object of the same name (deleted and created again)
	// is not compared with the write either.
	other := first.DeepCopy()
	other.UID, other.ResourceVersion, other.Status = "other-uid", "1", v1alpha1.NodeDevicesStatus{}
	if wrote, err := pub.Publish(ctx, other, status); err != nil || !wrote {
		t.Errorf("same inventory over a re-created object: wrote %v, %v; want a write", wrote, err)
	}
}

// applyRecorder is a clientset whose NodeDevices apply requests (object and
// status) return the merged object at the next resourceVersion, as the
// apiserver does, and are recorded in writes.
func applyRecorder(t *testing.T) (*fake.Clientset, *[]*v1alpha1.NodeDevices) {
	rc := fake.NewSimpleClientset()
	var stored *v1alpha1.NodeDevices
	var writes []*v1alpha1.NodeDevices
	rc.PrependReactor("patch", "nodedevices", func(action clienttesting.Action) (bool, runtime.Object, error) {
		patch := action.(clienttesting.PatchAction)
		var applied v1alpha1.NodeDevices
		if err := json.Unmarshal(patch.GetPatch(), &applied); err != nil {
			t.Errorf("apply patch: %v", err)
			return true, nil, err
		}
		if stored == nil {
			stored = &v1alpha1.NodeDevices{ObjectMeta: metav1.ObjectMeta{Name: patch.GetName(), UID: "nd-uid", ResourceVersion: "0"}}
		}
		next := stored.DeepCopy()
		if patch.GetSubresource() == "status" {
			next.Status = applied.Status
		} else {
			next.OwnerReferences = applied.OwnerReferences
		}
		rv, _ := strconv.Atoi(stored.ResourceVersion)
		next.ResourceVersion = strconv.Itoa(rv + 1)
		stored = next
		writes = append(writes, next.DeepCopy())
		return true, next.DeepCopy(), nil
	})
	return rc, &writes
}
