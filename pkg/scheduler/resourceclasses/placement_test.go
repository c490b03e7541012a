package resourceclasses

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// TestUnknownNUMAIsNotAligned: devices that publish no NUMA node give no
// alignment, neither on the quick path (Filter, Score) nor on the full one
// (Reserve), so NUMAAligned does not rank such a node with truly aligned ones.
func TestUnknownNUMAIsNotAligned(t *testing.T) {
	c := newCache()
	gpu := func(id string, numa *int64) v1alpha1.Device {
		attrs := map[string]v1alpha1.DeviceAttribute{}
		if numa != nil {
			attrs[v1alpha1.AttributeNUMANode] = v1alpha1.DeviceAttribute{IntValue: numa}
		}
		return v1alpha1.Device{ID: id, Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, Attributes: attrs}
	}
	zero := int64(0)
	c.setNodeDevices(&v1alpha1.NodeDevices{ObjectMeta: metav1.ObjectMeta{Name: "unknown", ResourceVersion: "1"},
		Status: v1alpha1.NodeDevicesStatus{Devices: []v1alpha1.Device{gpu("a", nil), gpu("b", nil)}}})
	c.setNodeDevices(&v1alpha1.NodeDevices{ObjectMeta: metav1.ObjectMeta{Name: "known", ResourceVersion: "1"},
		Status: v1alpha1.NodeDevicesStatus{Devices: []v1alpha1.Device{gpu("a", &zero), gpu("b", &zero)}}})
	c.setClass(&v1alpha1.ResourceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu", Generation: 1},
		Spec: v1alpha1.ResourceClassSpec{ResourceSelector: []v1alpha1.ResourcePropertySelector{{MatchExpressions: []v1alpha1.ResourceSelectorRequirement{
			{Key: "kind", Operator: v1alpha1.ResourceSelectorOpIn, Values: []string{v1alpha1.DeviceKindNvidiaGPU}}}}}}})
	d, err := podDemand(&corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{v1alpha1.ResourceNamePrefix + "gpu": resource.MustParse("2")}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	for node, want := range map[string]int{"unknown": 0, "known": 1} {
		n := c.nodes[node]
		fits, _, numas, handled := n.quick(d)
		if !handled || !fits || numas != want {
			t.Errorf("%s: quick = fits %v, numas %d, handled %v; want fits, numas %d", node, fits, numas, handled, want)
		}
		p, u := n.place(d, NUMAAligned)
		if u != nil || p.numas != want || p.aligned != (want == 1) {
			t.Errorf("%s: place = %+v, %v; want numas %d", node, p, u, want)
		}
	}
}
