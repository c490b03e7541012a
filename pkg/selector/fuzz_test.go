package selector

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/attrvalue"
	"github.com/resclass/resclass/pkg/internal/watchdog"
)

var fuzzOperators = []v1alpha1.ResourceSelectorOperator{"In", "NotIn", "Eq", "Exists", "DoesNotExist", "Gt", "GtEq", "Lt", "LtEq", "Bogus"}

// FuzzCompile feeds arbitrary requirements to Compile: it must never panic, a
// compiled class must evaluate every device without panicking, and Matches must
// agree with Explain.
func FuzzCompile(f *testing.F) {
	f.Add("memory", uint8(6), "30G", "", 2)
	f.Add("Kind", uint8(0), "nvidia-gpu", "nic", 2)
	f.Add("speed", uint8(5), "40GBPS", "", 1)
	f.Add("computeCapability", uint8(7), "8.6", "", 1)
	f.Add("custom", uint8(1), "3", "x", 2)
	f.Add("", uint8(9), "", "", 0)
	f.Add("memory", uint8(5), "1e999999999", "", 1)
	f.Add("custom", uint8(7), "1e-999999999", "", 1)
	devices := append(allSeeds, dev("nvidia-gpu", "GPU-odd").str("memory", "a lot").int("custom", 3).ver("firmware", "1.2"))
	f.Fuzz(func(t *testing.T, key string, opIndex uint8, v1, v2 string, nValues int) {
		watchdog.Run(t, func() {
			values := []string{v1, v2}[:max(0, min(nValues, 2))]
			s := spec(all(requirement(key, fuzzOperators[int(opIndex)%len(fuzzOperators)], values...)))
			c, errs := Compile(s, field.NewPath("spec"))
			if (c == nil) == (len(errs) == 0) {
				t.Fatalf("Compile returned class=%v with %d errors", c != nil, len(errs))
			}
			if c == nil {
				return
			}
			for _, d := range devices {
				p := d.prepared()
				m := c.Matches(p)
				if ok, why := c.Explain(p); ok != m || (!ok && len(why) == 0) {
					t.Fatalf("%s: Matches=%v but Explain=%v %q", d.d.ID, m, ok, why)
				}
			}
		})
	})
}

// FuzzMatch publishes an arbitrary attribute value of every type and checks the
// ordered operators against each other: exactly one of Lt, Eq, Gt holds whenever
// both sides are readable as the attribute's type.
func FuzzMatch(f *testing.F) {
	f.Add(uint8(3), "40Gi", "30G")
	f.Add(uint8(4), "100Gbps", "40GBPS")
	f.Add(uint8(5), "535.104.05", "535.86")
	f.Add(uint8(1), "-5", "7")
	f.Add(uint8(3), "1e18", "1e999999999")
	f.Add(uint8(3), "40Gi", "1e-999999999")
	f.Add(uint8(4), "9999999999999999999Pbps", "1.6Tbps")
	f.Add(uint8(0), "a", "b")
	f.Add(uint8(2), "true", "TRUE")
	f.Fuzz(func(t *testing.T, typeIndex uint8, published, wanted string) {
		watchdog.Run(t, func() {
			attr := v1alpha1.DeviceAttribute{}
			typ := valueTypes[int(typeIndex)%len(valueTypes)]
			switch typ {
			case v1alpha1.AttributeTypeString:
				attr.StringValue = &published
			case v1alpha1.AttributeTypeInt:
				i, err := parseInt(published)
				if err != nil {
					return
				}
				attr.IntValue = &i
			case v1alpha1.AttributeTypeBool:
				b, err := parseBool(published)
				if err != nil {
					return
				}
				attr.BoolValue = &b
			case v1alpha1.AttributeTypeQuantity:
				// JSON decoding parses with apimachinery as is, which itself
				// runs away on some exponents (the CRD's pattern refuses
				// those first); FuzzOutOfRangeAttribute covers the rest.
				if len(published) > 1000 || attrvalue.CheckExponent(published, attrvalue.MaxQuantityExponent) != nil {
					return
				}
				q, err := resource.ParseQuantity(published)
				if err != nil {
					return
				}
				attr.QuantityValue = &q
			case v1alpha1.AttributeTypeBandwidth:
				attr.BandwidthValue = &published
			case v1alpha1.AttributeTypeVersion:
				attr.VersionValue = &published
			}
			d := dev("thing", "x").raw("custom", attr).prepared()
			results := map[v1alpha1.ResourceSelectorOperator]bool{}
			for _, op := range []v1alpha1.ResourceSelectorOperator{"Lt", "Eq", "Gt", "LtEq", "GtEq", "In", "NotIn"} {
				c, errs := Compile(spec(all(requirement("custom", op, wanted))), field.NewPath("spec"))
				if len(errs) > 0 {
					return // the value reads as no ordered type: a validation error, as it should be
				}
				results[op] = c.Matches(d)
			}
			if results["Eq"] != results["In"] {
				t.Fatalf("Eq=%v but In=%v", results["Eq"], results["In"])
			}
			_, err := parseAs(wanted, typ)
			if len(d.Problems()) > 0 || err != nil || !isOrdered(typ) {
				if results["Lt"] || results["Gt"] || results["LtEq"] || results["GtEq"] {
					t.Fatalf("ordered comparison matched for %s %q vs %q: %v", typ, published, wanted, results)
				}
				return
			}
			n := 0
			for _, op := range []v1alpha1.ResourceSelectorOperator{"Lt", "Eq", "Gt"} {
				if results[op] {
					n++
				}
			}
			if n != 1 || results["LtEq"] != (results["Lt"] || results["Eq"]) || results["GtEq"] != (results["Gt"] || results["Eq"]) || results["NotIn"] == results["In"] {
				t.Fatalf("inconsistent comparisons for %s %q vs %q: %v", typ, published, wanted, results)
			}
		})
	})
}

// FuzzOutOfRangeAttribute publishes quantities that no JSON text within the
// CRD's pattern produces, but a NodeDevices written around it (or decoded by a
// client that does not bound exponents) may: any exponent, any digits. Matching
// and explaining must stay bounded, and an out-of-range value must be reported
// as a problem and never match.
func FuzzOutOfRangeAttribute(f *testing.F) {
	f.Add(int64(1), int32(999999999), uint8(5), "40Gi")
	f.Add(int64(1), int32(-999999999), uint8(8), "1")
	f.Add(int64(-7), int32(30), uint8(2), "30G")
	f.Add(int64(40), int32(9), uint8(6), "40G")
	classes := map[uint8]v1alpha1.ResourceSelectorOperator{0: "In", 1: "NotIn", 2: "Eq", 3: "Exists", 4: "DoesNotExist", 5: "Gt", 6: "GtEq", 7: "Lt", 8: "LtEq"}
	f.Fuzz(func(t *testing.T, value int64, scale int32, opIndex uint8, wanted string) {
		watchdog.Run(t, func() {
			op := classes[opIndex%9]
			var values []string
			if op != "Exists" && op != "DoesNotExist" {
				values = []string{wanted}
			}
			c, errs := Compile(spec(all(requirement(v1alpha1.AttributeMemory, op, values...))), field.NewPath("spec"))
			if len(errs) > 0 {
				return
			}
			q := resource.NewScaledQuantity(value, resource.Scale(scale))
			d := dev(v1alpha1.DeviceKindNvidiaGPU, "GPU-f").raw(v1alpha1.AttributeMemory, v1alpha1.DeviceAttribute{QuantityValue: q}).prepared()
			m := c.Matches(d)
			ok, why := c.Explain(d)
			if ok != m || (!ok && len(why) == 0) {
				t.Fatalf("Matches=%v, Explain=%v %q", m, ok, why)
			}
			if attrvalue.CheckQuantity(*q) != nil {
				if len(d.Problems()) != 1 {
					t.Fatalf("an out-of-range memory is not a problem: %v", d.Problems())
				}
				if m && op != "Exists" {
					t.Fatalf("%s %q matched an out-of-range memory", op, wanted)
				}
			}
		})
	})
}
