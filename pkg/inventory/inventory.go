// Package inventory publishes a node's devices: the NodeDevices object named after
// the node, and a few labels on the Node for humans and nodeSelectors.
//
// Both are written with server-side apply under one field manager, and only when
// what the agent would write differs from what the apiserver holds, so a node
// whose devices do not change costs the apiserver no writes however often the
// agent re-checks.
package inventory

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	resclassac "github.com/resclass/resclass/pkg/client/applyconfiguration/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
)

// FieldManager is the server-side apply field manager of the node agent's writes.
const FieldManager = "resclass-node-agent"

// Publisher writes one node's inventory. It is used by one goroutine at a time.
type Publisher struct {
	Resclass versioned.Interface
	Kube     kubernetes.Interface
	// Node is the Node the inventory belongs to: its name names the NodeDevices
	// object and its UID goes into the ownerReference.
	Node *corev1.Node
	// Kinds say which node labels are the agent's (kinds.Builtin when nil).
	Kinds *devicekind.Registry

	// written is the object as the apiserver returned it from this
	// publisher's last write. An informer delivers that write a little
	// later; until it does, its copy is older than written and must not be
	// compared with: its conditions would miss the transition times just
	// written, and the same inventory would be written again with new ones.
	written *v1alpha1.NodeDevices
}

// Publish makes the node's NodeDevices object hold status. current is the object
// as the apiserver last reported it (from an informer), nil if there is none.
// It reports whether it wrote anything.
//
// Conditions keep their lastTransitionTime while their status stays the same, so
// a re-published, unchanged inventory is equal to current and is not written.
func (p *Publisher) Publish(ctx context.Context, current *v1alpha1.NodeDevices, status v1alpha1.NodeDevicesStatus) (bool, error) {
	wrote := false
	current = p.newest(current)
	if current == nil || !ownedBy(current, p.Node) {
		// The object itself: its name and owner. A NodeDevices left over from a
		// Node of the same name that was deleted and re-created gets the new owner.
		obj := resclassac.NodeDevices(p.Node.Name).WithOwnerReferences(metav1ac.OwnerReference().
			WithAPIVersion("v1").WithKind("Node").WithName(p.Node.Name).WithUID(p.Node.UID))
		applied, err := p.Resclass.ResclassV1alpha1().NodeDevices().Apply(ctx, obj, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
		if err != nil {
			return false, fmt.Errorf("applying NodeDevices %s: %w", p.Node.Name, err)
		}
		current, wrote = applied, true
		p.written = applied
	}
	desired := status.DeepCopy()
	desired.Conditions = mergeConditions(current.Status.Conditions, status.Conditions)
	if equality.Semantic.DeepEqual(&current.Status, desired) {
		return wrote, nil
	}
	ac, err := statusApplyConfiguration(p.Node.Name, desired)
	if err != nil {
		return wrote, err
	}
	applied, err := p.Resclass.ResclassV1alpha1().NodeDevices().ApplyStatus(ctx, ac, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if err != nil {
		return wrote, fmt.Errorf("applying NodeDevices %s status: %w", p.Node.Name, err)
	}
	p.written = applied
	return true, nil
}

// newest returns the newer of current (the informer's copy) and the object
// this publisher last wrote. Only a copy of the same object (same UID) that is
// older than that write is replaced: a newer one carries someone else's change,
// a missing one a deletion, and both must be answered by writing again.
func (p *Publisher) newest(current *v1alpha1.NodeDevices) *v1alpha1.NodeDevices {
	if current == nil || p.written == nil || current.UID != p.written.UID {
		return current
	}
	if cmp, err := resourceversion.CompareResourceVersion(current.ResourceVersion, p.written.ResourceVersion); err == nil && cmp < 0 {
		return p.written
	}
	return current
}

// PublishLabels makes the node carry labels, and no other label this agent set
// before: server-side apply removes the labels a field manager stops applying.
// node is the Node as last observed.
func (p *Publisher) PublishLabels(ctx context.Context, node *corev1.Node, labels map[string]string) (bool, error) {
	reg := p.Kinds
	if reg == nil {
		reg = kinds.Builtin
	}
	if labelsApplied(reg, node, labels) {
		return false, nil
	}
	ac := corev1ac.Node(p.Node.Name).WithLabels(labels)
	if _, err := p.Kube.CoreV1().Nodes().Apply(ctx, ac, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
		return false, fmt.Errorf("applying labels to Node %s: %w", p.Node.Name, err)
	}
	return true, nil
}

// labelsApplied says whether the node has exactly labels among the labels the
// kinds may set, which are the only ones the agent applies.
func labelsApplied(kinds *devicekind.Registry, node *corev1.Node, labels map[string]string) bool {
	for k, v := range labels {
		if node.Labels[k] != v {
			return false
		}
	}
	for k := range node.Labels {
		if _, ok := labels[k]; !ok && kinds.IsLabel(k) {
			return false
		}
	}
	return true
}

func ownedBy(nd *v1alpha1.NodeDevices, node *corev1.Node) bool {
	for _, ref := range nd.OwnerReferences {
		if ref.Kind == "Node" && ref.APIVersion == "v1" && ref.Name == node.Name && ref.UID == node.UID {
			return true
		}
	}
	return false
}

// mergeConditions returns next with the lastTransitionTime of each condition
// whose status did not change taken from prev.
func mergeConditions(prev, next []metav1.Condition) []metav1.Condition {
	out := make([]metav1.Condition, 0, len(next))
	for _, c := range next {
		if old := meta.FindStatusCondition(prev, c.Type); old != nil && old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		} else if c.LastTransitionTime.IsZero() {
			c.LastTransitionTime = metav1.Now()
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// statusApplyConfiguration turns a status into its apply configuration. The
// apply configurations are generated with the same JSON names as the API types,
// so the JSON form converts one into the other without a field-by-field copy to
// keep in step with the API.
func statusApplyConfiguration(name string, status *v1alpha1.NodeDevicesStatus) (*resclassac.NodeDevicesApplyConfiguration, error) {
	data, err := json.Marshal(status)
	if err != nil {
		return nil, err
	}
	var sac resclassac.NodeDevicesStatusApplyConfiguration
	if err := json.Unmarshal(data, &sac); err != nil {
		return nil, fmt.Errorf("converting NodeDevices status to an apply configuration: %w", err)
	}
	return resclassac.NodeDevices(name).WithStatus(&sac), nil
}
