package nic_test

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/discovery/nic"
	"github.com/resclass/resclass/pkg/selector"
)

func init() { nic.WellKnown = kinds.Builtin.AttributeType }

// The proposal's fast.nic class selects the 100G port only.
func TestClassSelectsNICs(t *testing.T) {
	devs, err := nic.Discover(nic.Options{HostRoot: nic.Fixture(t)})
	if err != nil {
		t.Fatal(err)
	}
	class, errs := selector.Compile(&v1alpha1.ResourceClassSpec{ResourceSelector: []v1alpha1.ResourcePropertySelector{{
		MatchExpressions: []v1alpha1.ResourceSelectorRequirement{
			{Key: "Kind", Operator: "In", Values: []string{"nic"}},
			{Key: "speed", Operator: "GtEq", Values: []string{"40GBPS"}},
		},
	}}}, field.NewPath("spec"))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	var selected []string
	for i := range devs {
		if class.Matches(selector.NewDevice(&devs[i])) {
			selected = append(selected, devs[i].ID)
		}
	}
	if !slices.Equal(selected, []string{"0000:3b:00.0"}) {
		t.Errorf("fast.nic selects %v, want the 100G port", selected)
	}
}
