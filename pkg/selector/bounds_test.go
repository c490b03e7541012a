package selector

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/attrvalue"
	"github.com/resclass/resclass/pkg/internal/watchdog"
)

// The reproduction: the class is refused when compiled, and a device
// publishing the value makes no comparison run away.
func TestHostileValuesAtCompileAndMatch(t *testing.T) {
	_, errs := Compile(spec(all(requirement("memory", "Gt", "1e999999999"))), field.NewPath("spec"))
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), `spec.resourceSelector[0].matchExpressions[0].values[0]`) ||
		!strings.Contains(errs[0].Error(), "out of range (at most e18") {
		t.Fatalf("Compile(memory Gt 1e999999999) = %v", errs)
	}
	// A key that is not well known reads the value as every type it parses
	// as; an out-of-range number then reads as none that has an order.
	_, errs = Compile(spec(all(requirement("custom", "GtEq", "1e-999999999"))), field.NewPath("spec"))
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "GtEq compares numbers") {
		t.Fatalf("Compile(custom GtEq 1e-999999999) = %v", errs)
	}
	c40, errs := Compile(spec(all(requirement("memory", "GtEq", "40Gi"))), field.NewPath("spec"))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, q := range []resource.Quantity{
		resource.MustParse("1e999999999"),
		*resource.NewScaledQuantity(1, -1000000),
		*resource.NewScaledQuantity(1, 1000000),
	} {
		d := dev(v1alpha1.DeviceKindNvidiaGPU, "GPU-hostile").raw("memory", v1alpha1.DeviceAttribute{QuantityValue: &q}).prepared()
		watchdog.Run(t, func() {
			if c40.Matches(d) {
				t.Errorf("memory GtEq 40Gi matched an out-of-range memory")
			}
			ok, why := c40.Explain(d)
			if ok || len(why) != 1 || !strings.Contains(why[0], `attribute "memory": the quantity is out of range`) {
				t.Errorf("Explain = %v %q", ok, why)
			}
			if p := d.Problems(); len(p) != 1 || !errors.Is(p[0], attrvalue.ErrOutOfRange) {
				t.Errorf("Problems = %v", p)
			}
		})
	}
}
