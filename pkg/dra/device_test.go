package dra

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/blang/semver/v4"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	internal "k8s.io/kubernetes/pkg/apis/resource"
	"k8s.io/kubernetes/pkg/apis/resource/install"
	resourcevalidation "k8s.io/kubernetes/pkg/apis/resource/validation"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/attrvalue"
	"github.com/resclass/resclass/pkg/dra/dradevice"
)

func init() { install.Install(legacyscheme.Scheme) }

// profileDevices reads every device of every profile in e2e/profiles.
func profileDevices(t testing.TB) map[string][]v1alpha1.Device {
	t.Helper()
	files, err := filepath.Glob("../../e2e/profiles/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no profiles: %v", err)
	}
	out := map[string][]v1alpha1.Device{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var nd v1alpha1.NodeDevices
		if err := yaml.UnmarshalStrict(raw, &nd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if len(nd.Status.Devices) == 0 {
			t.Fatalf("%s: no devices", f)
		}
		out[filepath.Base(f)] = nd.Status.Devices
	}
	return out
}

// h100 is the one real GPU this project has seen, as docs/node-agent.md
// records it (issue 19's `node-agent discover`: an H100 80GB HBM3, driver
// 580.159.04) with the figures NVML reports for that model (81559 MiB,
// compute capability 9.0, Hopper). The UUID and PCI placement are the
// record's shape, not its values, which the document does not keep.
func h100() v1alpha1.Device {
	b := newDev("nvidia-gpu", "GPU-9a3b1c2d-0e4f-5a6b-7c8d-9e0f1a2b3c4d")
	return b.str("product", "NVIDIA H100 80GB HBM3").str("brand", "Nvidia").str("architecture", "Hopper").
		qty("memory", "81559Mi").ver("computeCapability", "9.0").ver("driverVersion", "580.159.04").
		ver("cudaDriverVersion", "13.0").bool("migEnabled", false).int("index", 0).int("minor", 0).
		str("pciAddress", "0000:18:00.0").int("numaNode", 0).str("pcieRoot", "pci0000:17").
		int("nvlinks", 0).d
}

// mig is a MIG device of the DGX A100 profile's first GPU as the node agent
// publishes one (docs/node-agent.md, "What is discovered"; the attributes
// pkg/discovery/nvml's MIG test expects): no profile carries MIG devices.
func mig() v1alpha1.Device {
	b := newDev("nvidia-mig", "MIG-4f5e6d7c-1a2b-5c3d-8e9f-0a1b2c3d4e5f")
	return b.str("parent", "GPU-6513270e-269e-4d37-b2a7-4de452e6b438").str("migProfile", "1g.5gb").
		int("gpuInstanceID", 9).int("computeInstanceID", 0).qty("memory", "4864Mi").int("multiprocessors", 14).
		str("product", "NVIDIA A100-SXM4-40GB").str("architecture", "Ampere").ver("computeCapability", "8.0").
		ver("driverVersion", "550.54.15").ver("cudaDriverVersion", "12.4").str("pciAddress", "0000:00:00.0").
		int("numaNode", 0).d
}

// mig20 is a 3g.20gb of the same GPU, the size docs/mig.md's example class
// asks for, with a potential slice's media engines.
func mig20() v1alpha1.Device {
	b := newDev("nvidia-mig", "MIG-9a8b7c6d-1a2b-5c3d-8e9f-0a1b2c3d4e5f")
	return b.str("parent", "GPU-6513270e-269e-4d37-b2a7-4de452e6b438").str("migProfile", "3g.20gb").
		int("gpuInstanceID", 2).int("computeInstanceID", 0).qty("memory", "19968Mi").int("multiprocessors", 42).
		int("decoders", 2).int("jpegs", 0).int("ofas", 0).
		str("product", "NVIDIA A100-SXM4-40GB").str("architecture", "Ampere").ver("computeCapability", "8.0").
		ver("driverVersion", "550.54.15").ver("cudaDriverVersion", "12.4").str("pciAddress", "0000:00:00.0").
		int("numaNode", 0).d
}

type devBuilder struct{ d v1alpha1.Device }

func newDev(kind, id string) *devBuilder {
	return &devBuilder{d: v1alpha1.Device{ID: id, Kind: kind, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{}}}
}
func (b *devBuilder) str(k, v string) *devBuilder {
	b.d.Attributes[k] = v1alpha1.StringAttribute(v)
	return b
}
func (b *devBuilder) int(k string, v int64) *devBuilder {
	b.d.Attributes[k] = v1alpha1.IntAttribute(v)
	return b
}
func (b *devBuilder) bool(k string, v bool) *devBuilder {
	b.d.Attributes[k] = v1alpha1.BoolAttribute(v)
	return b
}
func (b *devBuilder) qty(k, v string) *devBuilder {
	b.d.Attributes[k] = v1alpha1.QuantityAttribute(resource.MustParse(v))
	return b
}
func (b *devBuilder) bw(k, v string) *devBuilder {
	b.d.Attributes[k] = v1alpha1.BandwidthAttribute(v)
	return b
}
func (b *devBuilder) ver(k, v string) *devBuilder {
	b.d.Attributes[k] = v1alpha1.VersionAttribute(v)
	return b
}

// validateSlice runs Kubernetes' own ResourceSlice validation (the code the
// apiserver runs, at the pinned release) on devices.
func validateSlice(t testing.TB, devices []resourceapi.Device) {
	t.Helper()
	if errs := sliceErrors(t, devices); len(errs) > 0 {
		t.Errorf("the apiserver would refuse the slice: %v", errs.ToAggregate())
	}
}

func sliceErrors(t testing.TB, devices []resourceapi.Device) field.ErrorList {
	t.Helper()
	return specErrors(t, resourceapi.ResourceSliceSpec{Devices: devices})
}

// specErrors is what the apiserver's validation says of a slice of node-1's
// pool with spec's devices or counters.
func specErrors(t testing.TB, spec resourceapi.ResourceSliceSpec) field.ErrorList {
	t.Helper()
	spec.Driver, spec.NodeName = dradevice.DriverName, ptr("node-1")
	spec.Pool = resourceapi.ResourcePool{Name: "node-1", ResourceSliceCount: 1}
	slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "node-1-resclass.io-abcde"}, Spec: spec}
	var in internal.ResourceSlice
	if err := legacyscheme.Scheme.Convert(slice, &in, nil); err != nil {
		t.Fatal(err)
	}
	return resourcevalidation.ValidateResourceSlice(&in)
}

func ptr[T any](v T) *T { return &v }

func TestProfilesMapAndValidate(t *testing.T) {
	all := profileDevices(t)
	all["h100"] = []v1alpha1.Device{h100()}
	all["mig"] = []v1alpha1.Device{mig()}
	for name, devices := range all {
		t.Run(name, func(t *testing.T) {
			out, refused := dradevice.Devices(devices)
			if len(refused) > 0 {
				t.Fatalf("refused: %v", refused)
			}
			if len(out) != len(devices) {
				t.Fatalf("%d devices mapped, want %d", len(out), len(devices))
			}
			for i, d := range out {
				src := devices[i]
				if id, ok := dradevice.ID(&d); !ok || id != src.ID {
					t.Errorf("%s: id attribute %q, want %q", d.Name, id, src.ID)
				}
				if got := *d.Attributes[dradevice.AttributeKind].StringValue; got != src.Kind {
					t.Errorf("%s: kind %q, want %q", d.Name, got, src.Kind)
				}
				if n := len(d.Attributes) + len(d.Capacity); n != len(src.Attributes)+2 {
					t.Errorf("%s: %d attributes and capacities, want %d", d.Name, n, len(src.Attributes)+2)
				}
				if _, ok := src.Attributes["pcieRoot"]; ok {
					if got := d.Attributes["resource.kubernetes.io/pcieRoot"]; got.StringValue == nil || *got.StringValue != *src.Attributes["pcieRoot"].StringValue {
						t.Errorf("%s: resource.kubernetes.io/pcieRoot is %v", d.Name, got)
					}
				}
			}
			// A slice holds at most 64 devices with taints, 128 without.
			for start := 0; start < len(out); start += 64 {
				validateSlice(t, out[start:min(start+64, len(out))])
			}
		})
	}
}

func TestDeviceTypes(t *testing.T) {
	d := newDev("nvidia-gpu", "GPU-1").qty("memory", "40Gi").bw("speed", "100Gbps").bw("uplink", "25000Mbps").
		qty("scratch", "1.5k").ver("computeCapability", "8.0").ver("driverVersion", "535.104.05").
		ver("firmware", "v1.2.3.0.0").int("index", 3).bool("migEnabled", true).str("product", "A100").d
	d.Healthy = false
	got, err := dradevice.Device(&d)
	if err != nil {
		t.Fatal(err)
	}
	wantCap := map[resourceapi.QualifiedName]string{
		"memory":                       "40Gi",
		"speed":                        "100G",
		"bandwidth.resclass.io/uplink": "25G",
		"scratch":                      "1500",
	}
	if len(got.Capacity) != len(wantCap) {
		t.Errorf("capacity %v, want %v", got.Capacity, wantCap)
	}
	for name, want := range wantCap {
		c, ok := got.Capacity[name]
		if !ok || c.Value.Cmp(resource.MustParse(want)) != 0 {
			t.Errorf("capacity %s = %v, want %s", name, c.Value.String(), want)
		}
	}
	wantVer := map[resourceapi.QualifiedName]string{"computeCapability": "8.0.0", "driverVersion": "535.104.5", "firmware": "1.2.3"}
	for name, want := range wantVer {
		a := got.Attributes[name]
		if a.VersionValue == nil || *a.VersionValue != want {
			t.Errorf("version %s = %v, want %s", name, a, want)
			continue
		}
		if _, err := semver.Parse(*a.VersionValue); err != nil {
			t.Errorf("version %s: %v", name, err)
		}
	}
	if a := got.Attributes["index"]; a.IntValue == nil || *a.IntValue != 3 {
		t.Errorf("index = %v", a)
	}
	if a := got.Attributes["migEnabled"]; a.BoolValue == nil || !*a.BoolValue {
		t.Errorf("migEnabled = %v", a)
	}
	if a := got.Attributes["product"]; a.StringValue == nil || *a.StringValue != "A100" {
		t.Errorf("product = %v", a)
	}
	if len(got.Taints) != 1 || got.Taints[0].Key != dradevice.TaintUnhealthy || got.Taints[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Errorf("an unhealthy device has taints %v", got.Taints)
	}
	validateSlice(t, []resourceapi.Device{got})
}

func TestDeviceRefused(t *testing.T) {
	long := strings.Repeat("x", 65)
	many := newDev("x", "many")
	for i := range 31 {
		many.int("a"+strings.Repeat("b", i), int64(i))
	}
	for _, tc := range []struct {
		name string
		d    v1alpha1.Device
		why  string
	}{
		{"wrong type", newDev("nvidia-gpu", "g").str("memory", "lots").d, "published as string"},
		{"bad version", newDev("x", "g").ver("v", "1..2").d, "not a version"},
		{"four-part version", newDev("x", "g").ver("firmware", "1.2.3.4").d, "more than three parts"},
		{"long id", newDev("x", long).d, "id is longer"},
		{"long string", newDev("x", "g").str("s", long).d, "string is longer"},
		{"long name", newDev("x", "g").int("a"+strings.Repeat("b", 32), 1).d, "at most 32"},
		{"not a C identifier", newDev("x", "g").int("a-b", 1).d, "C identifiers"},
		{"named kind", newDev("x", "g").str("kind", "y").d, "device's own kind"},
		{"named id", newDev("x", "g").str("id", "y").d, "device's own id"},
		{"too many", many.d, "DRA allows 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dradevice.Device(&tc.d)
			if !errors.Is(err, dradevice.ErrRefused) || !strings.Contains(err.Error(), tc.why) {
				t.Errorf("got %v, want a refusal saying %q", err, tc.why)
			}
		})
	}
	// 30 attributes, with kind and id, is the most DRA takes.
	most := newDev("x", "most")
	for i := range 30 {
		most.int("a"+strings.Repeat("b", i), int64(i))
	}
	got, err := dradevice.Device(&most.d)
	if err != nil {
		t.Fatal(err)
	}
	validateSlice(t, []resourceapi.Device{got})
}

func TestDeviceName(t *testing.T) {
	for _, id := range []string{"hugepages-2mi-numa0", "abc"} {
		if got := dradevice.DeviceName(id); got != id {
			t.Errorf("dradevice.DeviceName(%q) = %q, want it kept", id, got)
		}
	}
	names := map[string]string{}
	for _, id := range []string{
		"GPU-6513270e-269e-4d37-b2a7-4de452e6b438", "gpu-6513270e-269e-4d37-b2a7-4de452e6b438-x",
		"0000:3b:00.0", "0000-3b-00-0", "0000.3b.00.0", "A", "a-", "-", ":::", "hugepages-1Gi-numa0", "hugepages-1gi-numa0",
		strings.Repeat("Z", 128), strings.Repeat("Z", 127) + "Y", "MIG-4f5e6d7c-1a2b-5c3d-8e9f-0a1b2c3d4e5f",
	} {
		got := dradevice.DeviceName(id)
		if errs := validation.IsDNS1123Label(got); len(errs) > 0 {
			t.Errorf("dradevice.DeviceName(%q) = %q: %v", id, got, errs)
		}
		if other, dup := names[got]; dup {
			t.Errorf("dradevice.DeviceName(%q) = dradevice.DeviceName(%q) = %q", id, other, got)
		}
		names[got] = id
		if dradevice.DeviceName(id) != got {
			t.Errorf("dradevice.DeviceName(%q) is not stable", id)
		}
	}
	if got := dradevice.DeviceName("0000:3b:00.0"); !strings.HasPrefix(got, "0000-3b-00-0-") {
		t.Errorf("dradevice.DeviceName(0000:3b:00.0) = %q, want the readable part kept", got)
	}
}

func TestSemver(t *testing.T) {
	for in, want := range map[string]string{
		"8": "8.0.0", "8.0": "8.0.0", "v12.4": "12.4.0", "535.104.05": "535.104.5", "1.2.3.0.0.0.0.0": "1.2.3",
		"999999999.999999999.999999999": "999999999.999999999.999999999", "1.2.3.4": "", "0.0.0.0.0.0.0.1": "",
	} {
		v, err := attrvalue.ParseVersion(in)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := dradevice.Semver(v)
		if got != want || ok != (want != "") {
			t.Errorf("dradevice.Semver(%s) = %q, %v; want %q", in, got, ok, want)
		}
		if ok {
			if _, err := semver.Parse(got); err != nil {
				t.Errorf("dradevice.Semver(%s) = %q: %v", in, got, err)
			}
		}
	}
}

// The validation the tests above rely on does refuse what it should.
func TestValidateSliceRefuses(t *testing.T) {
	bad := resourceapi.Device{Name: "Not_A_Label", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"v": {VersionValue: ptr("8.0")}}}
	if errs := sliceErrors(t, []resourceapi.Device{bad}); len(errs) != 2 {
		t.Errorf("Kubernetes' validation of a device named Not_A_Label with version 8.0 says %v, want two errors", errs)
	}
}

func TestSharedDeviceMapping(t *testing.T) {
	mps := sharing(h100(), "GPU-shared-mps", v1alpha1.SharingMPS, "81559Mi", "100", "")
	got, err := dradevice.Device(&mps)
	if err != nil {
		t.Fatal(err)
	}
	if got.AllowMultipleAllocations == nil || !*got.AllowMultipleAllocations {
		t.Errorf("a GPU in MPS mode has allowMultipleAllocations %v", got.AllowMultipleAllocations)
	}
	if a := got.Attributes["share.resclass.io/mode"]; a.StringValue == nil || *a.StringValue != "MPS" {
		t.Errorf("share.resclass.io/mode = %v, want MPS", a)
	}
	for name, want := range map[resourceapi.QualifiedName]struct{ value, step string }{
		"share.resclass.io/memory":  {"81559Mi", "1Mi"},
		"share.resclass.io/compute": {"100", "1"},
	} {
		c, ok := got.Capacity[name]
		if !ok || c.Value.Cmp(resource.MustParse(want.value)) != 0 {
			t.Errorf("capacity %s = %v, want %s", name, c.Value.String(), want.value)
			continue
		}
		p := c.RequestPolicy
		if p == nil || p.Default == nil || !p.Default.IsZero() || p.ValidRange == nil || p.ValidRange.Min == nil || !p.ValidRange.Min.IsZero() ||
			p.ValidRange.Max != nil || p.ValidRange.Step == nil || p.ValidRange.Step.Cmp(resource.MustParse(want.step)) != 0 || len(p.ValidValues) > 0 {
			t.Errorf("capacity %s: request policy %+v, want default 0, range from 0 in steps of %s", name, p, want.step)
		}
	}
	// The GPU's own memory stays what the selectors compare, and no claim
	// consumes it.
	mem := got.Capacity["memory"]
	if mem.Value.Cmp(resource.MustParse("81559Mi")) != 0 || mem.RequestPolicy == nil || mem.RequestPolicy.Default == nil || !mem.RequestPolicy.Default.IsZero() ||
		len(mem.RequestPolicy.ValidValues) != 1 || !mem.RequestPolicy.ValidValues[0].IsZero() {
		t.Errorf("capacity memory of a shared GPU = %+v, want 81559Mi that claims consume none of", mem)
	}
	if len(got.Taints) != 0 {
		t.Errorf("taints %v", got.Taints)
	}
	validateSlice(t, []resourceapi.Device{got})

	// The same GPU served whole is mapped as before sharing existed.
	plain := h100()
	before, err := dradevice.Device(&plain)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []v1alpha1.Device{sharing(h100(), plain.ID, v1alpha1.SharingExclusive, "", "", ""), sharing(h100(), plain.ID, v1alpha1.SharingExclusive, "80Gi", "100", "")} {
		got, err := dradevice.Device(&d)
		if err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(got, before) {
			t.Errorf("an Exclusive GPU maps to %+v, want %+v", got, before)
		}
	}
	if before.AllowMultipleAllocations != nil || before.Capacity["memory"].RequestPolicy != nil {
		t.Errorf("a GPU served whole allows several allocations: %+v", before)
	}
	if _, ok := before.Attributes["share.resclass.io/mode"]; ok {
		t.Error("a GPU served whole publishes a sharing mode")
	}

	// Every shared device of the equivalence tests is one the apiserver takes.
	mapped, refused := dradevice.Devices(sharedDevices())
	if len(refused) > 0 {
		t.Fatal(refused)
	}
	validateSlice(t, mapped)
}

// A mode change waiting for pods keeps the current mode published and taints
// the device, either way.
func TestSharedDeviceModeChange(t *testing.T) {
	for _, d := range []v1alpha1.Device{
		sharing(h100(), "GPU-a", v1alpha1.SharingMPS, "80Gi", "100", v1alpha1.SharingExclusive),
		sharing(h100(), "GPU-b", v1alpha1.SharingExclusive, "", "", v1alpha1.SharingTimeSlicing),
		sharing(h100(), "GPU-c", v1alpha1.SharingTimeSlicing, "80Gi", "100", v1alpha1.SharingMPS),
	} {
		d.Healthy = false
		got, err := dradevice.Device(&d)
		if err != nil {
			t.Fatal(err)
		}
		keys := []string{}
		for _, taint := range got.Taints {
			if taint.Effect != resourceapi.DeviceTaintEffectNoSchedule {
				t.Errorf("%s: taint %v", d.ID, taint)
			}
			keys = append(keys, taint.Key)
		}
		if strings.Join(keys, ",") != dradevice.TaintUnhealthy+","+dradevice.TaintModeChange {
			t.Errorf("%s: taints %v", d.ID, keys)
		}
		mode := got.Attributes["share.resclass.io/mode"].StringValue
		if shares := d.Sharing.Mode.Shares(); (mode != nil) != shares || shares && *mode != string(d.Sharing.Mode) {
			t.Errorf("%s: mode %v published, want the current one, %s", d.ID, mode, d.Sharing.Mode)
		}
		validateSlice(t, []resourceapi.Device{got})
	}
}

func TestSharedDeviceRefused(t *testing.T) {
	negative := sharing(newDev("custom", "x").qty("scratch", "-1").d, "c-neg", v1alpha1.SharingMPS, "1Gi", "100", "")
	if _, err := dradevice.Device(&negative); !errors.Is(err, dradevice.ErrRefused) || !strings.Contains(err.Error(), "negative") {
		t.Errorf("a shared device with a negative capacity: %v, want refused", err)
	}
	badCompute := sharing(h100(), "GPU-x", v1alpha1.SharingMPS, "1Gi", "101", "")
	if _, err := dradevice.Device(&badCompute); !errors.Is(err, dradevice.ErrRefused) || !strings.Contains(err.Error(), "100 percent") {
		t.Errorf("compute 101: %v, want refused", err)
	}
	// 27 attributes, kind and id fit; the mode and two capacities do not.
	many := newDev("x", "many")
	for i := range 28 {
		many.int("a"+strings.Repeat("b", i), int64(i))
	}
	full := sharing(many.d, "many", v1alpha1.SharingMPS, "1Gi", "100", "")
	if _, err := dradevice.Device(&full); !errors.Is(err, dradevice.ErrRefused) || !strings.Contains(err.Error(), "DRA allows 32") {
		t.Errorf("33 attributes and capacities: %v, want refused", err)
	}
}
