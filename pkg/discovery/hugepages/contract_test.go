package hugepages_test

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/discovery/hugepages"
	"github.com/resclass/resclass/pkg/selector"
)

func init() { hugepages.WellKnown = kinds.Builtin.AttributeType }

// The proposal's hugepages-1gig class (size GtEq 1G) selects the 1Gi pools.
func TestClassSelectsPools(t *testing.T) {
	devs, err := hugepages.Discover(hugepages.Options{HostRoot: hugepages.NUMAFixture(t)})
	if err != nil {
		t.Fatal(err)
	}
	class, errs := selector.Compile(&v1alpha1.ResourceClassSpec{ResourceSelector: []v1alpha1.ResourcePropertySelector{{
		MatchExpressions: []v1alpha1.ResourceSelectorRequirement{
			{Key: "Kind", Operator: "In", Values: []string{"huge-pages"}},
			{Key: "size", Operator: "GtEq", Values: []string{"1G"}},
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
	if want := []string{"hugepages-1Gi-numa0", "hugepages-1Gi-numa1"}; !slices.Equal(selected, want) {
		t.Errorf("hugepages-1gig selects %v, want %v", selected, want)
	}
}
