package kubectlplugin

import (
	"bytes"
	"strings"
	"testing"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
)

// TestShares: capacity counts a share class in units and names the unit;
// explain shows each shared GPU's use of its capacities and the units free
// per node and per GPU.
func TestShares(t *testing.T) {
	shared := func(id string) v1alpha1.Device {
		return v1alpha1.Device{ID: id, Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, Sharing: &v1alpha1.DeviceSharing{
			Mode: v1alpha1.SharingMPS, Capacity: map[string]resource.Quantity{
				v1alpha1.CapacityMemory: resource.MustParse("80Gi"), v1alpha1.CapacityCompute: resource.MustParse("100"),
			}}}
	}
	node := v1alpha1.NodeDevices{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	node.Status.Devices = []v1alpha1.Device{shared("g0"), shared("g1")}
	node.Status.Devices[0].Sharing.Enforcement = []v1alpha1.SharingEnforcement{
		{Capacity: v1alpha1.CapacityMemory, Mechanism: v1alpha1.MechanismMPSClientLimit, Strength: v1alpha1.EnforcementSoft},
	}
	class := v1alpha1.ResourceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu-10g"}, Spec: v1alpha1.ResourceClassSpec{
		ResourceSelector: []v1alpha1.ResourcePropertySelector{{MatchExpressions: []v1alpha1.ResourceSelectorRequirement{
			{Key: "kind", Operator: v1alpha1.ResourceSelectorOpIn, Values: []string{v1alpha1.DeviceKindNvidiaGPU}},
		}}},
		Share: &v1alpha1.ResourceShare{Memory: ptr.To(resource.MustParse("10Gi")), Compute: ptr.To(int32(12))},
	}}
	// A pod holding 3 units (30Gi, 36%) of g0.
	raw, err := assignment.Encode(&assignment.Assignment{Node: "n1", Containers: []assignment.Container{{Name: "app",
		Classes: map[string][]string{"gpu-10g": {"g0"}}, Shares: map[string]assignment.Share{"gpu-10g": {"memory": 30 << 30, "compute": 36}}}}})
	if err != nil {
		t.Fatal(err)
	}
	pod := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "nb", Namespace: "ml", UID: "uid-nb", Annotations: map[string]string{assignment.AnnotationKey: raw}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "app", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{v1alpha1.ResourceNamePrefix + "gpu-10g": resource.MustParse("3")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	w := &world{nodes: []v1alpha1.NodeDevices{node}, classes: []v1alpha1.ResourceClass{class}, pods: []corev1.Pod{pod}}

	caps := capacity(w, nil, true)
	// 8 units per GPU (80Gi / 10Gi, 100% / 12%); g0 has 50Gi and 64% free: 5.
	if len(caps) != 1 || caps[0].Unit != "10Gi memory, 12% compute" || caps[0].Allocatable != 16 || caps[0].Free != 13 || caps[0].Held != 3 ||
		len(caps[0].Nodes) != 1 || caps[0].Nodes[0].Free != 13 {
		t.Errorf("capacity: %+v", caps)
	}

	e, err := explain(w.snapshot(), nil, "gpu-10g", "")
	if err != nil {
		t.Fatal(err)
	}
	if n := e.Nodes[0]; n.Units != 16 || n.FreeUnits != 13 || n.Free != 2 {
		t.Errorf("explain's node: units %d free %d, devices free %d; want 16, 13 and 2", n.Units, n.FreeUnits, n.Free)
	}
	var out bytes.Buffer
	tb := &table{w: tabwriter.NewWriter(&out, 0, 8, 2, ' ', 0)}
	e.table(tb)
	if err := tb.w.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"units free 13/16",
		"free   MPS shares use memory 30Gi/80Gi, compute 36/100%; units free 5/8; enforced by memory MPSClientLimit (Soft); held by ml/nb",
		"free   MPS shares use memory 0/80Gi, compute 0/100%; units free 8/8",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("explain's table lacks %q:\n%s", want, out.String())
		}
	}
}
