package dra

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/dra/dradevice"
	"github.com/resclass/resclass/pkg/selector"
)

// The judge of the translation: for a class and a device, selector.Matches on
// the resclass device and the DeviceClass's CEL on the DRA device (as the
// apiserver stores it: through JSON) evaluated by the upstream DRA CEL library
// (what kube-scheduler's allocator runs) must agree. A CEL runtime error is a
// failure too: the allocator aborts the whole allocation on one.

var programs sync.Map // expression -> dracel.CompilationResult

func celMatches(t testing.TB, expr string, d resourceapi.Device, driver string) bool {
	t.Helper()
	p, ok := programs.Load(expr)
	if !ok {
		// Selector has estimated the cost already.
		r := dracel.GetCompiler(Features).CompileCELExpression(expr, dracel.Options{DisableCostEstimation: true})
		if r.Error != nil {
			t.Fatalf("%s: %v", expr, r.Error)
		}
		p, _ = programs.LoadOrStore(expr, r)
	}
	m, _, err := p.(dracel.CompilationResult).DeviceMatches(context.Background(), dracel.Device{Driver: driver, Attributes: d.Attributes, Capacity: d.Capacity})
	if err != nil {
		t.Fatalf("CEL runtime error (the allocator would abort): %v\nexpression: %s\ndevice: %+v", err, expr, d)
	}
	return m
}

// published is d as the apiserver stores and the scheduler reads it.
func published(t testing.TB, d resourceapi.Device) resourceapi.Device {
	t.Helper()
	raw, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	var out resourceapi.Device
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// testDevice is a device as both sides see it: the resclass device prepared
// for the selector, and the DRA device as published (nil when refused).
type testDevice struct {
	id  string
	sel *selector.Device
	dra *resourceapi.Device
}

func prepare(t testing.TB, devices []v1alpha1.Device) []testDevice {
	t.Helper()
	out := make([]testDevice, 0, len(devices))
	for i := range devices {
		d := &devices[i]
		td := testDevice{id: d.ID, sel: selector.NewDevice(d)}
		if mapped, err := dradevice.Device(d); err == nil {
			p := published(t, mapped)
			td.dra = &p
		}
		out = append(out, td)
	}
	return out
}

// checkEquivalent compares the class with every device, and reports how many
// of them it selects (-1: refused for DRA's limits).
func checkEquivalent(t testing.TB, name string, spec *v1alpha1.ResourceClassSpec, devices []testDevice) (selected int) {
	t.Helper()
	class, errs := selector.Compile(spec, field.NewPath("spec"))
	expr, err := Selector(spec)
	if len(errs) > 0 {
		if err == nil {
			t.Fatalf("%s: the selector refuses the class (%v) but the translation is %s", name, errs.ToAggregate(), expr)
		}
		return 0
	}
	if err != nil {
		if !errors.Is(err, ErrUntranslatable) {
			t.Fatalf("%s: %v does not wrap ErrUntranslatable", name, err)
		}
		return -1
	}
	for _, d := range devices {
		if d.dra == nil {
			continue // not published through DRA
		}
		want := class.Matches(d.sel)
		if got := celMatches(t, expr, *d.dra, dradevice.DriverName); got != want {
			_, why := class.Explain(d.sel)
			t.Fatalf("%s on device %s: selector says %v (%v), CEL says %v\nspec: %+v\nCEL: %s\nDRA device: %+v",
				name, d.id, want, why, got, spec.ResourceSelector, expr, *d.dra)
		}
		if want {
			selected++
			// The same device from another driver is not ours to give.
			if celMatches(t, expr, *d.dra, "gpu.nvidia.com") {
				t.Fatalf("%s selects a device of driver gpu.nvidia.com: %s", name, expr)
			}
		}
	}
	return selected
}

// exampleClasses are the ResourceClasses of deploy/examples and the yaml
// blocks of docs/.
func exampleClasses(t testing.TB) map[string]v1alpha1.ResourceClass {
	t.Helper()
	type doc struct {
		source string
		raw    []byte
	}
	var docs []doc
	examples, _ := filepath.Glob("../../deploy/examples/*.yaml")
	for _, f := range examples {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, doc{filepath.Base(f), raw})
	}
	mds, _ := filepath.Glob("../../docs/*.md")
	block := regexp.MustCompile("(?s)```yaml\n(.*?)```")
	for _, f := range mds {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range block.FindAllSubmatch(raw, -1) {
			docs = append(docs, doc{filepath.Base(f), m[1]})
		}
	}
	out := map[string]v1alpha1.ResourceClass{}
	for _, d := range docs {
		source := d.source
		for _, part := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(d.raw), -1) {
			var meta struct{ Kind string }
			if err := yaml.Unmarshal([]byte(part), &meta); err != nil || meta.Kind != "ResourceClass" {
				continue
			}
			var rc v1alpha1.ResourceClass
			if err := yaml.UnmarshalStrict([]byte(part), &rc); err != nil {
				t.Fatalf("an example ResourceClass does not decode: %v\n%s", err, part)
			}
			out[rc.Name+" ("+source+")"] = rc
		}
	}
	return out
}

// extraDevices have what no profile has: attributes no kind declares, of every
// type, and values at the edges of what the mapping carries.
func extraDevices() []v1alpha1.Device {
	return []v1alpha1.Device{
		newDev("custom", "c-1").ver("firmware", "1.2.3").bw("uplink", "25Gbps").qty("scratch", "1536").
			str("note", "5").int("count", 5).bool("flag", true).str("label", "TRUE").d,
		newDev("custom", "c-2").ver("firmware", "1.2.3.0").qty("uplink", "25G").bw("scratch", "1.5kbps").
			int("note", 5).ver("count", "5").str("flag", "true").bool("label", true).d,
		newDev("custom", "c-3").ver("firmware", "v2").int("count", -9223372036854775808).qty("scratch", "0.5Ki").
			str("note", `a "quoted" \ note ünïcode`).qty("uplink", "30m").d,
		newDev("custom", "c-4").ver("note", "5.0.0").bw("count", "5bps").int("firmware", 1).str("uplink", "30m").
			qty("memory", "30G").bw("speed", "40Gbps").d,
		newDev("nic", "0000:3b:00.0").bw("speed", "25000Mbps").int("mtu", 9000).bool("linkUp", false).
			str("pcieRoot", "pci0000:3a").d,
		newDev("huge-pages", "hugepages-2Mi-numa1").qty("size", "2Mi").int("pagesTotal", 0).int("numaNode", 1).d,
	}
}

// sharing sets d's sharing (docs/sharing.md): mode, the capacities shares
// may take (memory and compute; "" leaves one out) and a requested mode.
func sharing(d v1alpha1.Device, id string, mode v1alpha1.SharingMode, memory, compute string, requested v1alpha1.SharingMode) v1alpha1.Device {
	d.ID = id
	d.Sharing = &v1alpha1.DeviceSharing{Mode: mode, RequestedMode: requested, Capacity: map[string]resource.Quantity{}}
	if memory != "" {
		d.Sharing.Capacity[v1alpha1.CapacityMemory] = resource.MustParse(memory)
	}
	if compute != "" {
		d.Sharing.Capacity[v1alpha1.CapacityCompute] = resource.MustParse(compute)
	}
	return d
}

// sharedDevices are devices in every sharing state: serving shares in each
// mode, with both capacities, one, or capacities at the edges (one byte, no
// compute left), waiting for a mode change either way, unhealthy, a
// device's memory and its share capacity apart, and an Exclusive device
// that publishes a sharing block.
func sharedDevices() []v1alpha1.Device {
	a100 := newDev("nvidia-gpu", "x").str("product", "NVIDIA A100-SXM4-40GB").qty("memory", "40Gi").
		ver("computeCapability", "8.0").int("index", 1).d
	sick := sharing(h100(), "GPU-shared-sick", v1alpha1.SharingMPS, "81559Mi", "100", "")
	sick.Healthy = false
	return []v1alpha1.Device{
		sharing(h100(), "GPU-shared-mps", v1alpha1.SharingMPS, "81559Mi", "100", ""),
		sharing(a100, "GPU-shared-ts", v1alpha1.SharingTimeSlicing, "40Gi", "100", ""),
		sharing(a100, "GPU-shared-memory-only", v1alpha1.SharingMPS, "20Gi", "", ""),
		sharing(a100, "GPU-shared-compute-only", v1alpha1.SharingTimeSlicing, "", "50", ""),
		sharing(a100, "GPU-shared-less-than-memory", v1alpha1.SharingMPS, "30000Mi", "75", ""),
		sharing(a100, "GPU-exclusive-block", v1alpha1.SharingExclusive, "", "", ""),
		sharing(a100, "GPU-to-exclusive", v1alpha1.SharingMPS, "40Gi", "100", v1alpha1.SharingExclusive),
		sharing(a100, "GPU-to-mps", v1alpha1.SharingExclusive, "", "", v1alpha1.SharingMPS),
		sharing(newDev("custom", "x").int("count", 1).d, "c-shared-edges", v1alpha1.SharingTimeSlicing, "1", "0", ""),
		sick,
	}
}

func allDevices(t testing.TB) []testDevice {
	t.Helper()
	var out []v1alpha1.Device
	for _, ds := range profileDevices(t) {
		out = append(out, ds...)
	}
	unhealthy := h100()
	unhealthy.ID, unhealthy.Healthy = "GPU-unhealthy", false
	out = append(append(append(out, h100(), unhealthy, mig(), mig20()), extraDevices()...), sharedDevices()...)
	prepared := prepare(t, out)
	for _, d := range prepared {
		if d.dra == nil {
			t.Fatalf("device %s is refused: the equivalence would not cover it", d.id)
		}
	}
	return prepared
}

func req(key string, op v1alpha1.ResourceSelectorOperator, values ...string) v1alpha1.ResourceSelectorRequirement {
	return v1alpha1.ResourceSelectorRequirement{Key: key, Operator: op, Values: values}
}

func specOf(selectors ...[]v1alpha1.ResourceSelectorRequirement) *v1alpha1.ResourceClassSpec {
	s := &v1alpha1.ResourceClassSpec{}
	for _, exprs := range selectors {
		s.ResourceSelector = append(s.ResourceSelector, v1alpha1.ResourcePropertySelector{MatchExpressions: exprs})
	}
	return s
}

func TestExampleClassesEquivalent(t *testing.T) {
	devices := allDevices(t)
	classes := exampleClasses(t)
	for _, name := range []string{"nvidia.high.mem (resourceclasses.yaml)", "hugepages-1gig (resourceclasses.yaml)",
		"fast.nic (resourceclasses.yaml)", "inference.gpu (resourceclasses.yaml)", "fast.nic (resource-classes.md)"} {
		if _, ok := classes[name]; !ok {
			t.Errorf("example class %s not found (found %d classes)", name, len(classes))
		}
	}
	for name, rc := range classes {
		n := checkEquivalent(t, name, &rc.Spec, devices)
		t.Logf("%s selects %d of %d devices", name, n, len(devices))
		if _, errs := selector.Compile(&rc.Spec, field.NewPath("spec")); len(errs) == 0 && n <= 0 {
			t.Errorf("example class %s selects no device (%d): the comparison proves little", name, n)
		}
	}
}

var (
	operators = []v1alpha1.ResourceSelectorOperator{"In", "NotIn", "Eq", "Exists", "DoesNotExist", "Gt", "GtEq", "Lt", "LtEq"}
	// Keys of every kind: declared ones of every type, the device's own,
	// undeclared ones (published with several types by extraDevices), one
	// no device has, one no DRA device can have.
	corpusKeys = []string{
		"kind", "Kind", "id", "memory", "speed", "size", "computeCapability", "driverVersion", "product",
		"migEnabled", "index", "numaNode", "mtu", "pcieRoot", "firmware", "uplink", "scratch", "note",
		"count", "flag", "label", "migProfile", "absent", "not-a-c-identifier",
	}
	// Values that read as several types, or differently as each.
	corpusValues = []string{
		"nvidia-gpu", "nic", "30G", "40Gi", "81559Mi", "80G", "40GBPS", "25Gbps", "25000Mbps", "1536", "1.5k", "1.5Ki",
		"0.5Ki", "30m", "5", "-5", "5.0", "5.0.0", "8.0", "9", "1.2.3", "1.2.3.4", "1.2.2.9", "v2", "550.54.15", "580.159.04",
		"12.4", "true", "TRUE", "false", "0", "9000", "pci0000:3a", "pci0000:00", "NVIDIA A100-SXM4-40GB",
		"GPU-unhealthy", "0000:3b:00.0", "nvidia-mig", "1g.5gb", "4864Mi", "-9223372036854775808", "9223372036854775807", `a "quoted" \ note ünïcode`,
		"1e18", "4Ei",
	}
)

// Every operator on every corpus key with every corpus value (one value, or
// two for In and NotIn), alone and in an AND and an OR with a kind test.
func TestOperatorCorpusEquivalent(t *testing.T) {
	devices := allDevices(t)
	var refused, total int
	hits := map[v1alpha1.ResourceSelectorOperator]int{}
	for _, key := range corpusKeys {
		for _, op := range operators {
			values := [][]string{nil}
			if op != "Exists" && op != "DoesNotExist" {
				values = nil
				for i, v := range corpusValues {
					values = append(values, []string{v})
					if (op == "In" || op == "NotIn") && i%4 == 0 {
						values = append(values, []string{v, corpusValues[(i+7)%len(corpusValues)]})
					}
				}
			}
			for i, vs := range values {
				r := req(key, op, vs...)
				specs := []*v1alpha1.ResourceClassSpec{specOf([]v1alpha1.ResourceSelectorRequirement{r})}
				if i%8 == 0 {
					specs = append(specs, specOf([]v1alpha1.ResourceSelectorRequirement{req("kind", "In", "custom", "nvidia-gpu"), r}, []v1alpha1.ResourceSelectorRequirement{req("kind", "Eq", "nic")}))
				}
				for _, spec := range specs {
					total++
					n := checkEquivalent(t, key+" "+string(op)+" "+strings.Join(vs, ","), spec, devices)
					if n < 0 {
						refused++
					}
					if n > 0 {
						hits[op]++
					}
				}
			}
		}
	}
	t.Logf("%d classes, %d refused for DRA's limits, classes selecting a device per operator: %v", total, refused, hits)
	if refused > 0 {
		t.Errorf("%d corpus classes (one or two short values) were refused for DRA's limits", refused)
	}
	for _, op := range operators {
		if hits[op] == 0 {
			t.Errorf("no corpus class with %s selects any device: the comparison proves little", op)
		}
	}
}

// Classes at the selector's limits: 16 selectors of 16 expressions, 64
// values of 128 characters. The translation refuses what the apiserver
// would, and whatever it translates agrees.
func TestLargeClasses(t *testing.T) {
	devices := allDevices(t)
	long := strings.Repeat("x", 120)
	var many []string
	for i := range 64 {
		many = append(many, long+string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	var wide []v1alpha1.ResourceSelectorRequirement
	for i := range 16 {
		wide = append(wide, req(corpusKeys[i], "Exists"))
	}
	var sels [][]v1alpha1.ResourceSelectorRequirement
	for range 16 {
		sels = append(sels, wide)
	}
	for _, tc := range []struct {
		name   string
		spec   *v1alpha1.ResourceClassSpec
		refuse string
	}{
		{"64 long values", specOf([]v1alpha1.ResourceSelectorRequirement{req("note", "In", many...)}), ""},
		{"twice 64 long values", specOf([]v1alpha1.ResourceSelectorRequirement{req("note", "In", many...), req("product", "NotIn", many...)}), "10240"},
		{"16x16 Exists", specOf(sels...), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expr, err := Selector(tc.spec)
			if err == nil {
				r := dracel.GetCompiler(Features).CompileCELExpression(expr, dracel.Options{})
				t.Logf("%d bytes, estimated cost %d", len(expr), r.MaxCost)
			}
			switch {
			case tc.refuse == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.refuse != "" && (err == nil || !strings.Contains(err.Error(), tc.refuse)):
				t.Fatalf("got %v, want a refusal saying %q", err, tc.refuse)
			}
			if err == nil {
				checkEquivalent(t, tc.name, tc.spec, devices)
			}
		})
	}
}

func TestNoSelectorsSelectNothing(t *testing.T) {
	for _, spec := range []*v1alpha1.ResourceClassSpec{{}, specOf(nil), specOf(nil, nil)} {
		expr, err := Selector(spec)
		if err != nil {
			t.Fatal(err)
		}
		if want := `device.driver == "resclass.io" && false`; expr != want {
			t.Errorf("got %s, want %s", expr, want)
		}
		checkEquivalent(t, "empty", spec, allDevices(t))
	}
}

func TestQuote(t *testing.T) {
	for _, s := range []string{"", "plain", `a"b\c`, "tab\there\nnew", "ünï", "\u2028", "\U0001F600", "\x00\x7f"} {
		expr := `device.driver == ` + quote(s)
		r := dracel.GetCompiler(Features).CompileCELExpression(expr, dracel.Options{})
		if r.Error != nil {
			t.Fatalf("%q: %v", s, r.Error)
		}
		m, _, err := r.DeviceMatches(context.Background(), dracel.Device{Driver: s})
		if err != nil || !m {
			t.Errorf("%q quoted as %s does not read back: %v %v", s, quote(s), m, err)
		}
	}
	if !bytes.Equal([]byte(quote("ab")), []byte(`"ab"`)) {
		t.Error(quote("ab"))
	}
}

// Share classes of several units on devices in every sharing state (and
// whole classes, in the tests above, on the same devices): each side selects
// a shared device for a share class only when one unit fits, and never for a
// whole class.
func TestShareClassesEquivalent(t *testing.T) {
	devices := allDevices(t)
	shares := map[string]*v1alpha1.ResourceShare{
		"10Gi":           {Memory: ptr(resource.MustParse("10Gi"))},
		"81559Mi":        {Memory: ptr(resource.MustParse("81559Mi"))},
		"81560Mi":        {Memory: ptr(resource.MustParse("81560Mi"))},
		"1 byte":         {Memory: ptr(resource.MustParse("1"))},
		"0.5Ki":          {Memory: ptr(resource.MustParse("0.5Ki"))},
		"25%":            {Compute: ptr(int32(25))},
		"100%":           {Compute: ptr(int32(100))},
		"10Gi and 25%":   {Memory: ptr(resource.MustParse("10Gi")), Compute: ptr(int32(25))},
		"30G and 75%":    {Memory: ptr(resource.MustParse("30G")), Compute: ptr(int32(75))},
		"20Gi and 51%":   {Memory: ptr(resource.MustParse("20Gi")), Compute: ptr(int32(51))},
		"1 byte and 1%":  {Memory: ptr(resource.MustParse("1")), Compute: ptr(int32(1))},
		"1e18 and 100%":  {Memory: ptr(resource.MustParse("1e18")), Compute: ptr(int32(100))},
		"1Ki, too small": {Memory: ptr(resource.MustParse("1Ki"))},
	}
	selectors := map[string][]v1alpha1.ResourceSelectorRequirement{
		"gpus":        {req("kind", "In", "nvidia-gpu")},
		"big gpus":    {req("kind", "In", "nvidia-gpu"), req("memory", "GtEq", "40G")},
		"any":         {req("kind", "Exists")},
		"custom":      {req("kind", "Eq", "custom")},
		"hopper":      {req("architecture", "In", "Hopper")},
		"not a count": {req("count", "DoesNotExist")},
	}
	sharedSelected := map[string]bool{}
	for sname, sh := range shares {
		total := 0
		for selName, exprs := range selectors {
			spec := specOf(exprs)
			spec.Share = sh
			n := checkEquivalent(t, sname+" of "+selName, spec, devices)
			if n < 0 {
				t.Fatalf("%s of %s refused", sname, selName)
			}
			total += n
			class, _ := selector.Compile(spec, field.NewPath("spec"))
			for _, d := range devices {
				if class.Matches(d.sel) {
					if _, _, ok := d.sel.Sharing(); !ok {
						t.Errorf("share class %s of %s selects device %s, which is served whole", sname, selName, d.id)
					}
					sharedSelected[d.id] = true
				}
			}
		}
		t.Logf("share %s: %d selections", sname, total)
		if want := sname != "81560Mi" && sname != "1e18 and 100%"; (total > 0) != want {
			t.Errorf("share %s selects %d devices in all, want some: %v", sname, total, want)
		}
	}
	for _, id := range []string{"GPU-shared-mps", "GPU-shared-ts", "GPU-shared-memory-only", "GPU-shared-compute-only", "GPU-to-exclusive", "c-shared-edges", "GPU-shared-sick"} {
		if !sharedSelected[id] {
			t.Errorf("no share class selects %s: the comparison proves little", id)
		}
	}
	for _, id := range []string{"GPU-exclusive-block", "GPU-to-mps"} {
		if sharedSelected[id] {
			t.Errorf("a share class selects %s, which is served whole", id)
		}
	}
	// A whole class selects the devices served whole and none that serves
	// shares.
	whole := specOf(selectors["gpus"])
	class, _ := selector.Compile(whole, field.NewPath("spec"))
	for _, d := range devices {
		_, _, shared := d.sel.Sharing()
		if strings.HasPrefix(d.id, "GPU-") && class.Matches(d.sel) == shared && d.sel.Problems() == nil {
			t.Errorf("the whole class of GPUs selects %s: %v, and it serves shares: %v", d.id, !shared, shared)
		}
	}
	checkEquivalent(t, "whole gpus", whole, devices)
}
