package selector

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

func selectedIDs(c *Class, devs []*deviceBuilder) []string {
	var ids []string
	for _, d := range devs {
		if c.Matches(d.prepared()) {
			ids = append(ids, d.d.ID)
		}
	}
	return ids
}

func TestSeedClasses(t *testing.T) {
	dgx := mockDGXA100GPUs(t)
	if len(dgx) != 8 {
		t.Fatalf("DGX A100 mock has %d GPUs, want 8", len(dgx))
	}
	inventory := append(slices.Clone(allSeeds), dgx...)
	var dgxIDs []string
	for _, d := range dgx {
		dgxIDs = append(dgxIDs, d.d.ID)
	}

	for _, tc := range []struct {
		name string
		spec *v1alpha1.ResourceClassSpec
		want []string
	}{{
		// "30G" is 30*10^9 bytes: the 40GB and 80GB cards qualify (even the H100, which
		// reports slightly less than 80GiB), the 16GB T4 does not.
		name: "nvidia.high.mem",
		spec: seedNvidiaHighMem,
		want: append([]string{"GPU-a100-80", "GPU-h100"}, dgxIDs...),
	}, {
		name: "hugepages-1gig",
		spec: seedHugepages1Gig,
		want: []string{"hugepages-1Gi-numa0"},
	}, {
		// 40GBPS is 40 gigabits per second; 25000Mbps is 25 Gbit/s.
		name: "fast.nic",
		spec: seedFastNIC,
		want: []string{"0000:3b:00.0"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := selectedIDs(mustCompile(t, tc.spec), inventory)
			if !slices.Equal(got, tc.want) {
				t.Errorf("selected %v, want %v", got, tc.want)
			}
		})
	}
}

func TestOperators(t *testing.T) {
	mig := dev("nvidia-gpu", "GPU-mig").qty("memory", "80Gi").bool("migEnabled", true).
		ver("computeCapability", "8.0").int("numaNode", 1).str("product", "NVIDIA A100-SXM4-80GB").
		str("rack", "r12").int("slot", 3).bw("uplink", "200Gbps").ver("firmware", "20.31.1014").qty("bar1", "128Gi")

	for _, tc := range []struct {
		name string
		expr v1alpha1.ResourceSelectorRequirement
		want bool
	}{
		{"In string", requirement("product", "In", "Tesla T4", "NVIDIA A100-SXM4-80GB"), true},
		{"In string none", requirement("product", "In", "Tesla T4"), false},
		{"In is exact for strings", requirement("product", "In", "nvidia a100-sxm4-80gb"), false},
		{"In quantity by value", requirement("memory", "In", "85899345920"), true},
		{"In quantity other notation", requirement("memory", "In", "80Gi", "40Gi"), true},
		{"NotIn quantity", requirement("memory", "NotIn", "40Gi"), true},
		{"NotIn quantity hit", requirement("memory", "NotIn", "80Gi"), false},
		{"NotIn absent attribute", requirement("driver", "NotIn", "nouveau"), true},
		{"In absent attribute", requirement("driver", "In", "nouveau"), false},
		{"Eq bool", requirement("migEnabled", "Eq", "true"), true},
		{"Eq bool any case", requirement("migEnabled", "Eq", "TRUE"), true},
		{"Eq bool false", requirement("migEnabled", "Eq", "false"), false},
		{"Eq int", requirement("numaNode", "Eq", "1"), true},
		{"Eq version padded", requirement("computeCapability", "Eq", "8.0.0"), true},
		{"Eq version short", requirement("computeCapability", "Eq", "8"), true},
		{"Exists", requirement("migEnabled", "Exists"), true},
		{"Exists absent", requirement("speed", "Exists"), false},
		{"DoesNotExist", requirement("speed", "DoesNotExist"), true},
		{"DoesNotExist present", requirement("memory", "DoesNotExist"), false},
		{"Gt quantity", requirement("memory", "Gt", "80G"), true},
		{"Gt quantity equal", requirement("memory", "Gt", "80Gi"), false},
		{"GtEq quantity equal", requirement("memory", "GtEq", "80Gi"), true},
		{"GtEq quantity with B", requirement("memory", "GtEq", "80GiB"), true},
		{"Lt quantity", requirement("memory", "Lt", "100G"), true},
		{"LtEq quantity", requirement("memory", "LtEq", "80G"), false},
		{"Gt version", requirement("computeCapability", "Gt", "7.5"), true},
		{"Gt version numeric not lexical", requirement("computeCapability", "Lt", "10.0"), true},
		{"Lt version", requirement("computeCapability", "Lt", "8.6"), true},
		{"GtEq int", requirement("numaNode", "GtEq", "1"), true},
		{"Lt int", requirement("numaNode", "Lt", "1"), false},
		{"kind In", requirement("kind", "In", "nic", "nvidia-gpu"), true},
		{"kind NotIn", requirement("Kind", "NotIn", "nvidia-gpu"), false},
		{"id Eq", requirement("id", "Eq", "GPU-mig"), true},
		// Attributes that are not well known are compared with the type the device
		// publishes them with.
		{"custom string", requirement("rack", "In", "r12"), true},
		{"custom int ordered", requirement("slot", "Gt", "2"), true},
		{"custom int not readable", requirement("slot", "In", "three"), false},
		{"custom bandwidth", requirement("uplink", "GtEq", "100Gbps"), true},
		{"custom bandwidth other notation", requirement("uplink", "Eq", "200000Mbps"), true},
		{"custom version", requirement("firmware", "GtEq", "20.28"), true},
		{"custom quantity", requirement("bar1", "Gt", "64Gi"), true},
		{"custom ordering on string attribute", requirement("rack", "Gt", "5"), false},
		{"custom ordering value of another type", requirement("uplink", "Gt", "8.0.1"), false},
		{"missing attribute never orders", requirement("temperature", "Lt", "80"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mustCompile(t, spec(all(tc.expr)))
			d := mig.prepared()
			if got := c.Matches(d); got != tc.want {
				t.Errorf("Matches = %v, want %v", got, tc.want)
			}
			ok, why := c.Explain(d)
			if ok != tc.want {
				t.Errorf("Explain = %v, want %v", ok, tc.want)
			}
			if !ok && len(why) == 0 {
				t.Errorf("Explain gave no reason for a non-match")
			}
		})
	}
}

func TestSelectorLogic(t *testing.T) {
	gpuSel := all(requirement("kind", "In", "nvidia-gpu"), requirement("memory", "GtEq", "30G"))
	nicSel := all(requirement("kind", "In", "nic"), requirement("speed", "GtEq", "100G"))
	for _, tc := range []struct {
		name string
		spec *v1alpha1.ResourceClassSpec
		want []string
	}{
		{"nil selector list matches nothing", &v1alpha1.ResourceClassSpec{}, nil},
		{"empty selector matches nothing", spec(all()), nil},
		{"empty selector beside a real one is ignored", spec(all(), nicSel), []string{"0000:3b:00.0"}},
		{"ANY selector", spec(gpuSel, nicSel), []string{"GPU-a100-80", "GPU-h100", "0000:3b:00.0"}},
		{"ALL expressions", spec(all(requirement("kind", "In", "nic"), requirement("driver", "In", "ice", "ixgbe"), requirement("mtu", "Exists"))), []string{"0000:5e:00.0"}},
		{"contradiction", spec(all(requirement("kind", "In", "nic"), requirement("kind", "In", "huge-pages"))), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := selectedIDs(mustCompile(t, tc.spec), allSeeds)
			if !slices.Equal(got, tc.want) {
				t.Errorf("selected %v, want %v", got, tc.want)
			}
		})
	}
}

func TestValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		expr v1alpha1.ResourceSelectorRequirement
		path string // the field the error names
		msg  string
	}{
		{"unknown operator", requirement("memory", "GreaterThan", "1"), "spec.resourceSelector[0].matchExpressions[1].operator", "Unsupported value"},
		{"empty key", requirement("", "Exists"), "spec.resourceSelector[0].matchExpressions[1].key", "Required"},
		{"In without values", requirement("kind", "In"), "spec.resourceSelector[0].matchExpressions[1].values", "at least one value"},
		{"NotIn without values", requirement("kind", "NotIn"), "spec.resourceSelector[0].matchExpressions[1].values", "at least one value"},
		{"Exists with values", requirement("memory", "Exists", "1"), "spec.resourceSelector[0].matchExpressions[1].values", "takes no values"},
		{"DoesNotExist with values", requirement("memory", "DoesNotExist", "1"), "spec.resourceSelector[0].matchExpressions[1].values", "takes no values"},
		{"Gt with two values", requirement("memory", "Gt", "1G", "2G"), "spec.resourceSelector[0].matchExpressions[1].values", "exactly one value"},
		{"Eq without value", requirement("memory", "Eq"), "spec.resourceSelector[0].matchExpressions[1].values", "exactly one value"},
		{"memory is a quantity", requirement("memory", "GtEq", "lots"), "spec.resourceSelector[0].matchExpressions[1].values[0]", `"memory" is a quantity`},
		{"memory In checks every value", requirement("memory", "In", "40Gi", "80 GB"), "spec.resourceSelector[0].matchExpressions[1].values[1]", "not a quantity"},
		{"speed needs a unit", requirement("speed", "GtEq", "40000"), "spec.resourceSelector[0].matchExpressions[1].values[0]", "needs a unit"},
		{"speed has no binary prefix", requirement("speed", "GtEq", "40Gi"), "spec.resourceSelector[0].matchExpressions[1].values[0]", "not a bandwidth"},
		{"version", requirement("computeCapability", "GtEq", "8.x"), "spec.resourceSelector[0].matchExpressions[1].values[0]", "not a version"},
		{"int", requirement("numaNode", "Eq", "0.5"), "spec.resourceSelector[0].matchExpressions[1].values[0]", "not an integer"},
		{"bool", requirement("migEnabled", "Eq", "yes"), "spec.resourceSelector[0].matchExpressions[1].values[0]", "not a boolean"},
		{"string has no order", requirement("product", "Gt", "A"), "spec.resourceSelector[0].matchExpressions[1].operator", "has no order"},
		{"kind has no order", requirement("Kind", "Lt", "nic"), "spec.resourceSelector[0].matchExpressions[1].operator", "has no order"},
		{"bool has no order", requirement("migEnabled", "Gt", "false"), "spec.resourceSelector[0].matchExpressions[1].operator", "has no order"},
		{"custom ordering needs an ordered value", requirement("rack", "Gt", "r12"), "spec.resourceSelector[0].matchExpressions[1].values[0]", "none of them"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec(all(requirement("kind", "In", "nvidia-gpu"), tc.expr))
			c, errs := Compile(s, field.NewPath("spec"))
			if c != nil {
				t.Errorf("Compile returned a class despite errors")
			}
			if len(errs) != 1 {
				t.Fatalf("got %d errors, want 1: %v", len(errs), errs.ToAggregate())
			}
			if errs[0].Field != tc.path {
				t.Errorf("error names %s, want %s", errs[0].Field, tc.path)
			}
			if !strings.Contains(errs[0].Error(), tc.msg) {
				t.Errorf("error %q does not contain %q", errs[0].Error(), tc.msg)
			}
			if got := Validate(s, field.NewPath("spec")); len(got) != 1 {
				t.Errorf("Validate gave %d errors, want 1", len(got))
			}
		})
	}
}

func TestValidationReportsEveryError(t *testing.T) {
	s := spec(
		all(requirement("memory", "Gt", "x"), requirement("speed", "Lt", "1")),
		all(requirement("kind", "Bogus", "nic")),
	)
	_, errs := Compile(s, field.NewPath("spec"))
	var fields []string
	for _, e := range errs {
		fields = append(fields, e.Field)
	}
	want := []string{
		"spec.resourceSelector[0].matchExpressions[0].values[0]",
		"spec.resourceSelector[0].matchExpressions[1].values[0]",
		"spec.resourceSelector[1].matchExpressions[0].operator",
	}
	if !slices.Equal(fields, want) {
		t.Errorf("errors name %v, want %v", fields, want)
	}
}

func TestBadDeviceAttributes(t *testing.T) {
	q := resource.MustParse("40Gi")
	one := int64(1)
	d := dev("nvidia-gpu", "GPU-bad").
		str("memory", "40GB").                                                         // well known, wrong type
		bw("speed", "fast").                                                           // unparsable bandwidth
		ver("firmware", "1.x").                                                        // unparsable version
		raw("twoValues", v1alpha1.DeviceAttribute{QuantityValue: &q, IntValue: &one}). // schema forbids it
		raw("noValue", v1alpha1.DeviceAttribute{}).
		prepared()
	if got := len(d.Problems()); got != 5 {
		t.Fatalf("Problems() = %d, want 5: %v", got, d.Problems())
	}
	for _, tc := range []struct {
		expr v1alpha1.ResourceSelectorRequirement
		want bool
	}{
		{requirement("memory", "GtEq", "30G"), false},
		{requirement("memory", "NotIn", "40Gi"), false},
		{requirement("speed", "GtEq", "1Gbps"), false},
		{requirement("firmware", "Eq", "1.0"), false},
		{requirement("twoValues", "Eq", "1"), false},
		// The attribute is there even though its value is unusable.
		{requirement("noValue", "Exists"), true},
		{requirement("noValue", "DoesNotExist"), false},
	} {
		c := mustCompile(t, spec(all(tc.expr)))
		if got := c.Matches(d); got != tc.want {
			t.Errorf("%s %s %v: Matches = %v, want %v", tc.expr.Key, tc.expr.Operator, tc.expr.Values, got, tc.want)
		}
	}
	c := mustCompile(t, spec(all(requirement("memory", "GtEq", "30G"))))
	if _, why := c.Explain(d); len(why) != 1 || !strings.Contains(why[0], "published as string, but it is a quantity") {
		t.Errorf("Explain = %q, want the published-type problem", why)
	}
}

func TestExplain(t *testing.T) {
	c := mustCompile(t, spec(
		all(requirement("kind", "In", "nvidia-gpu"), requirement("memory", "GtEq", "30G")),
		all(requirement("kind", "In", "nvidia-gpu"), requirement("architecture", "Exists")),
	))
	ok, why := c.Explain(teslaT4.prepared())
	want := []string{
		"resourceSelector[0]: memory is 15Gi, not GtEq 30G",
		`resourceSelector[1]: the device has no "architecture" attribute (Exists )`,
	}
	if ok || !slices.Equal(why, want) {
		t.Errorf("Explain = %v %q, want false %q", ok, why, want)
	}
	if ok, why := c.Explain(a100x80.prepared()); !ok || why != nil {
		t.Errorf("Explain(a100) = %v %q, want true and no reasons", ok, why)
	}
	if ok, why := mustCompile(t, spec()).Explain(a100x80.prepared()); ok || len(why) != 1 {
		t.Errorf("empty class: Explain = %v %q", ok, why)
	}
}

func TestMatchesDoesNotAllocate(t *testing.T) {
	classes := []*Class{mustCompile(t, seedNvidiaHighMem), mustCompile(t, seedFastNIC), mustCompile(t, seedHugepages1Gig)}
	devs := []*Device{a100x80.prepared(), nic100G.prepared(), pages1G.prepared(), teslaT4.prepared()}
	allocs := testing.AllocsPerRun(100, func() {
		for _, c := range classes {
			for _, d := range devs {
				c.Matches(d)
			}
		}
	})
	if allocs != 0 {
		t.Errorf("Matches allocated %v times per run, want 0", allocs)
	}
}

// TestShareSelection: a share class selects only devices that serve shares
// with room for one unit, a class without a share only devices served
// whole, and Explain says which rule a device fails.
func TestShareSelection(t *testing.T) {
	q := resource.MustParse
	gpu := func(mode v1alpha1.SharingMode, capacity map[string]resource.Quantity) *v1alpha1.Device {
		d := &v1alpha1.Device{ID: "g", Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true}
		if mode != "" {
			d.Sharing = &v1alpha1.DeviceSharing{Mode: mode, Capacity: capacity}
		}
		return d
	}
	any := []v1alpha1.ResourcePropertySelector{{MatchExpressions: []v1alpha1.ResourceSelectorRequirement{{Key: "kind", Operator: v1alpha1.ResourceSelectorOpIn, Values: []string{"nvidia-gpu"}}}}}
	mem := q("10Gi")
	compute := int32(30)
	whole := &v1alpha1.ResourceClassSpec{ResourceSelector: any}
	shares := &v1alpha1.ResourceClassSpec{ResourceSelector: any, Share: &v1alpha1.ResourceShare{Memory: &mem, Compute: &compute}}
	cap80 := map[string]resource.Quantity{"memory": q("80Gi"), "compute": q("100")}
	for name, tc := range map[string]struct {
		spec    *v1alpha1.ResourceClassSpec
		dev     *v1alpha1.Device
		matches bool
		why     string
	}{
		"whole class, no sharing":        {whole, gpu("", nil), true, ""},
		"whole class, exclusive":         {whole, gpu(v1alpha1.SharingExclusive, nil), true, ""},
		"whole class, mps":               {whole, gpu(v1alpha1.SharingMPS, cap80), false, "serves shares (MPS)"},
		"share class, whole device":      {shares, gpu("", nil), false, "served whole"},
		"share class, exclusive":         {shares, gpu(v1alpha1.SharingExclusive, cap80), false, "served whole"},
		"share class, mps":               {shares, gpu(v1alpha1.SharingMPS, cap80), true, ""},
		"share class, time-slicing":      {shares, gpu(v1alpha1.SharingTimeSlicing, cap80), true, ""},
		"share class, too little memory": {shares, gpu(v1alpha1.SharingMPS, map[string]resource.Quantity{"memory": q("8Gi"), "compute": q("100")}), false, "more than the device's"},
		"share class, no compute":        {shares, gpu(v1alpha1.SharingMPS, map[string]resource.Quantity{"memory": q("80Gi")}), false, "no compute capacity"},
	} {
		t.Run(name, func(t *testing.T) {
			c, errs := Compile(tc.spec, field.NewPath("spec"))
			if len(errs) > 0 {
				t.Fatal(errs)
			}
			d := NewDevice(tc.dev)
			if got := c.Matches(d); got != tc.matches {
				t.Errorf("Matches = %v, want %v", got, tc.matches)
			}
			ok, why := c.Explain(d)
			if ok != tc.matches || (tc.why != "" && !strings.Contains(strings.Join(why, "; "), tc.why)) {
				t.Errorf("Explain = %v %q, want %v and %q", ok, why, tc.matches, tc.why)
			}
		})
	}
}

// TestShareValidation: the unit is checked as the CRD's schema checks it,
// for a client that got past the schema.
func TestShareValidation(t *testing.T) {
	q := resource.MustParse
	i32 := func(v int32) *int32 { return &v }
	qp := func(s string) *resource.Quantity { v := q(s); return &v }
	for name, tc := range map[string]struct {
		share *v1alpha1.ResourceShare
		want  string
	}{
		"empty":            {&v1alpha1.ResourceShare{}, "a share takes memory, compute or both"},
		"zero memory":      {&v1alpha1.ResourceShare{Memory: qp("0")}, "must be more than 0"},
		"negative memory":  {&v1alpha1.ResourceShare{Memory: qp("-1Gi")}, "must be more than 0"},
		"memory over 1Ei":  {&v1alpha1.ResourceShare{Memory: qp("2Ei")}, "at most 1Ei"},
		"compute 0":        {&v1alpha1.ResourceShare{Compute: i32(0)}, "percentage from 1 to 100"},
		"compute over 100": {&v1alpha1.ResourceShare{Compute: i32(101)}, "percentage from 1 to 100"},
	} {
		t.Run(name, func(t *testing.T) {
			spec := &v1alpha1.ResourceClassSpec{ResourceSelector: []v1alpha1.ResourcePropertySelector{{MatchExpressions: []v1alpha1.ResourceSelectorRequirement{{Key: "kind", Operator: v1alpha1.ResourceSelectorOpExists}}}}, Share: tc.share}
			errs := Validate(spec, field.NewPath("spec"))
			if len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), tc.want) {
				t.Errorf("Validate = %v, want an error with %q", errs, tc.want)
			}
		})
	}
}

// TestShareFits: units fit by division, so no request overflows.
func TestShareFits(t *testing.T) {
	s := Share{Memory: 10 << 30, Compute: 25}
	c := Capacity{Memory: 80 << 30, Compute: 100}
	for units, want := range map[int64]bool{0: true, 1: true, 4: true, 5: false, 1 << 62: false} {
		if got, _ := s.Fits(units, c); got != want {
			t.Errorf("Fits(%d) = %v, want %v", units, got, want)
		}
	}
	if got := s.Times(3); got != (Share{Memory: 30 << 30, Compute: 75}) {
		t.Errorf("Times(3) = %+v", got)
	}
}

// TestCreateMIGSelection: a potential MIG slice is selected only by a class
// with createMIG, which selects existing devices as any class does; a share
// class cannot create slices.
func TestCreateMIGSelection(t *testing.T) {
	migs := []v1alpha1.ResourcePropertySelector{{MatchExpressions: []v1alpha1.ResourceSelectorRequirement{
		{Key: "kind", Operator: v1alpha1.ResourceSelectorOpIn, Values: []string{"nvidia-mig"}},
		{Key: "memory", Operator: v1alpha1.ResourceSelectorOpGtEq, Values: []string{"20G"}},
	}}}
	slice := func(mem string) *v1alpha1.Device {
		return &v1alpha1.Device{ID: "GPU-0/mig/x@0", Kind: v1alpha1.DeviceKindNvidiaMIG, Healthy: true,
			Attributes: map[string]v1alpha1.DeviceAttribute{v1alpha1.AttributeMemory: v1alpha1.QuantityAttribute(resource.MustParse(mem))}}
	}
	creates := &v1alpha1.ResourceClassSpec{ResourceSelector: migs, CreateMIG: true}
	existing := &v1alpha1.ResourceClassSpec{ResourceSelector: migs}
	for name, tc := range map[string]struct {
		spec      *v1alpha1.ResourceClassSpec
		dev       *Device
		matches   bool
		why       string
		createMIG bool
	}{
		"createMIG, potential":           {creates, NewPotentialDevice(slice("40Gi")), true, "", true},
		"createMIG, potential too small": {creates, NewPotentialDevice(slice("10Gi")), false, "memory is 10Gi", true},
		"createMIG, existing":            {creates, NewDevice(slice("40Gi")), true, "", true},
		"existing only, potential":       {existing, NewPotentialDevice(slice("40Gi")), false, "does not set createMIG", false},
		"existing only, existing":        {existing, NewDevice(slice("40Gi")), true, "", false},
	} {
		t.Run(name, func(t *testing.T) {
			c, errs := Compile(tc.spec, field.NewPath("spec"))
			if len(errs) > 0 {
				t.Fatal(errs)
			}
			if c.CreatesMIG() != tc.createMIG {
				t.Errorf("CreatesMIG = %v", c.CreatesMIG())
			}
			if got := c.Matches(tc.dev); got != tc.matches {
				t.Errorf("Matches = %v, want %v", got, tc.matches)
			}
			ok, why := c.Explain(tc.dev)
			if ok != tc.matches || (tc.why != "" && !strings.Contains(strings.Join(why, "; "), tc.why)) {
				t.Errorf("Explain = %v %q, want %v and %q", ok, why, tc.matches, tc.why)
			}
		})
	}
	compute := int32(10)
	_, errs := Compile(&v1alpha1.ResourceClassSpec{ResourceSelector: migs, CreateMIG: true, Share: &v1alpha1.ResourceShare{Compute: &compute}}, field.NewPath("spec"))
	if len(errs) != 1 || errs[0].Field != "spec.createMIG" {
		t.Errorf("share with createMIG: %v", errs)
	}
}
