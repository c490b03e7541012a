package dra

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// A share class's DeviceClass has no extended resource (its unit is not
// what the extended-resource form would consume) and selects devices by
// their sharing mode and share capacities; a whole class's keeps its
// extended resource and selects devices without a sharing mode.
func TestShareClassDeviceClass(t *testing.T) {
	spec := specOf([]v1alpha1.ResourceSelectorRequirement{req("kind", "In", "nvidia-gpu")})
	whole := &v1alpha1.ResourceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu", UID: "u1"}, Spec: *spec}
	shared := whole.DeepCopy()
	shared.Name = "gpu-10g"
	shared.Spec.Share = &v1alpha1.ResourceShare{Memory: ptr(resource.MustParse("10Gi")), Compute: ptr(int32(25))}

	dc, err := DeviceClass(whole)
	if err != nil {
		t.Fatal(err)
	}
	if dc.Spec.ExtendedResourceName == nil || *dc.Spec.ExtendedResourceName != "class.resclass.io/gpu" {
		t.Errorf("whole class: extendedResourceName %v", dc.Spec.ExtendedResourceName)
	}
	if e := dc.Spec.Selectors[0].CEL.Expression; !strings.Contains(e, `!("mode" in device.attributes["share.resclass.io"])`) {
		t.Errorf("whole class selector does not leave out shared devices: %s", e)
	}
	if ac := applyConfiguration(dc); ac.Spec.ExtendedResourceName == nil || *ac.Spec.ExtendedResourceName != "class.resclass.io/gpu" {
		t.Errorf("whole class applies extendedResourceName %v", ac.Spec.ExtendedResourceName)
	}

	dc, err = DeviceClass(shared)
	if err != nil {
		t.Fatal(err)
	}
	if dc.Spec.ExtendedResourceName != nil {
		t.Errorf("share class: extendedResourceName %q, want none", *dc.Spec.ExtendedResourceName)
	}
	e := dc.Spec.Selectors[0].CEL.Expression
	for _, want := range []string{
		`"mode" in device.attributes["share.resclass.io"]`,
		`device.capacity["share.resclass.io"]["memory"].compareTo(quantity("10737418240")) >= 0`,
		`device.capacity["share.resclass.io"]["compute"].compareTo(quantity("25")) >= 0`,
	} {
		if !strings.Contains(e, want) {
			t.Errorf("share class selector %s lacks %s", e, want)
		}
	}
	if ac := applyConfiguration(dc); ac.Spec.ExtendedResourceName != nil {
		t.Errorf("share class applies extendedResourceName %q", *ac.Spec.ExtendedResourceName)
	}
	if err := Check(e); err != nil {
		t.Error(err)
	}
}
