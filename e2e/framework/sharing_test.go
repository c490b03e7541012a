package framework

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// TestShareGPUs: the dgx-a100 profile's GPUs, time-sliced as the agent
// publishes them, are 4 slots each of a 10Gi/25% share class and none of a
// whole class; left exclusive (the default), the reverse.
func TestShareGPUs(t *testing.T) {
	selectors := []v1alpha1.ResourcePropertySelector{{MatchExpressions: []v1alpha1.ResourceSelectorRequirement{
		{Key: "kind", Operator: v1alpha1.ResourceSelectorOpIn, Values: []string{"nvidia-gpu"}},
	}}}
	memory, compute := resource.MustParse("10Gi"), int32(25)
	whole := &v1alpha1.ResourceClass{Spec: v1alpha1.ResourceClassSpec{ResourceSelector: selectors}}
	share := &v1alpha1.ResourceClass{Spec: v1alpha1.ResourceClassSpec{ResourceSelector: selectors, Share: &v1alpha1.ResourceShare{Memory: &memory, Compute: &compute}}}
	for _, tc := range []struct {
		mode              v1alpha1.SharingMode
		wantWhole, wantSh int64
	}{
		{"", 8, 0},
		{v1alpha1.SharingExclusive, 8, 0},
		{v1alpha1.SharingTimeSlicing, 0, 32},
		{v1alpha1.SharingMPS, 0, 32},
	} {
		status, err := LoadProfile("dgx-a100")
		if err != nil {
			t.Fatal(err)
		}
		ShareGPUs(status.Devices, tc.mode)
		for _, d := range status.Devices {
			if shared := d.Sharing != nil; shared != (tc.mode.Shares() && d.Kind == v1alpha1.DeviceKindNvidiaGPU) {
				t.Errorf("mode %q: device %s (%s) has sharing %+v", tc.mode, d.ID, d.Kind, d.Sharing)
			}
			if d.Sharing != nil {
				if m := d.Sharing.Capacity[v1alpha1.CapacityMemory]; m.Cmp(resource.MustParse("40Gi")) != 0 || d.Sharing.Mode != tc.mode {
					t.Errorf("mode %q: device %s has sharing %+v, want mode %s and 40Gi", tc.mode, d.ID, d.Sharing, tc.mode)
				}
			}
		}
		for _, c := range []struct {
			class *v1alpha1.ResourceClass
			want  int64
		}{{whole, tc.wantWhole}, {share, tc.wantSh}} {
			got, err := ClassCapacity(c.class, status.Devices)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("mode %q: capacity %d of class (share %v), want %d", tc.mode, got, c.class.Spec.Share != nil, c.want)
			}
		}
	}
}
