// Package dradevice is how a resclass device becomes a DRA device
// (resource.k8s.io/v1): the contract between the node agent, which publishes
// ResourceSlices, and pkg/dra's DeviceClass translation, which selects what it
// publishes. It is a package of its own, without CEL, so that the node agent
// does not link cel-go and the apiserver's CEL libraries (3.4 MB of its
// binary's mapped text, docs/node-agent.md "Memory").
//
// The mapping is type-faithful or it refuses: every comparison a ResourceClass
// makes on a resclass device, the translated CEL makes on the mapped DRA device
// with the same result (pkg/dra's equivalence test and
// FuzzSelectorCELEquivalence judge it). A device that cannot be mapped that way
// is refused as a whole with a message, never published with an attribute
// dropped or retyped: dropping one would turn NotIn and DoesNotExist from false
// to true. docs/dra.md ("Devices") has the table.
package dradevice

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/attrvalue"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/selector"
)

const (
	// DriverName is the one DRA driver name of every resclass device, whatever
	// its kind; the kind is the attribute AttributeKind. It is also the domain
	// of every attribute and capacity the mapping writes, except the two below.
	DriverName = "resclass.io"

	// BandwidthDomain is the capacity domain of a bandwidth attribute that no
	// device kind declares. DRA capacities carry no unit, and a class value
	// reads differently as a quantity and as a bandwidth ("30m" is 0.03 or
	// 30*10^6), so a capacity of an undeclared name must say which it is.
	// Declared bandwidths (speed) are in DriverName's domain: their type is
	// known from the name.
	BandwidthDomain = "bandwidth.resclass.io"

	// StandardDomain is Kubernetes' domain of standard device attributes.
	StandardDomain = "resource.kubernetes.io"

	// AttributeKind and AttributeID are string attributes (in DriverName's
	// domain) carrying the device's kind and its resclass id: the DRA device
	// name is a DNS label derived from the id (DeviceName), not the id.
	AttributeKind = "kind"
	AttributeID   = "id"

	// TaintUnhealthy is the key of the NoSchedule taint an unhealthy device
	// carries (DRADeviceTaints, beta and on by default in Kubernetes 1.36):
	// the allocator gives it to no new claim, and claims already allocated keep
	// it, as the device-plugin path does.
	TaintUnhealthy = "resclass.io/unhealthy"

	// ShareDomain holds what a device that serves shares (Device.Sharing in
	// a mode that shares, docs/sharing.md) publishes of its sharing: the
	// string attribute AttributeShareMode ("TimeSlicing" or "MPS") and the
	// capacities the claims' shares consume (v1alpha1.CapacityMemory in
	// bytes, v1alpha1.CapacityCompute in percent). A domain of its own,
	// because the driver's domain carries the device's attributes, which a
	// class's selector compares: the memory attribute (a capacity there too)
	// is the GPU's memory whoever uses it, and an undeclared attribute may be
	// named compute or mode.
	ShareDomain = "share.resclass.io"

	// AttributeShareMode is the sharing mode of a device that serves shares,
	// in ShareDomain: what the selectors of share classes and of whole
	// classes test. CEL declares device.allowMultipleAllocations only where
	// DRAConsumableCapacity is on, and an expression reading it would not
	// compile elsewhere; an attribute compiles in every environment and says
	// the mode too.
	AttributeShareMode = "mode"

	// TaintModeChange is the key of the NoSchedule taint a device carries
	// while a change of its sharing mode waits for the pods that hold it
	// (DeviceSharing.RequestedMode): it keeps publishing its current mode,
	// claims that have it keep it, and no new claim gets it, as the resclass
	// scheduler places nothing on it.
	TaintModeChange = "resclass.io/sharing-mode-change"
)

// The steps in which a share's capacities are consumed: a claim's request is
// rounded up to them by the allocator (KEP-5075's validRange). Fine enough
// for any class's unit (docs/sharing.md: memory in bytes, compute in
// percent), coarse enough that a share's memory is the MPS client limit's
// unit (MiB).
var (
	shareMemoryStep  = resource.MustParse("1Mi")
	shareComputeStep = resource.MustParse("1")
)

// pcieRoot is published under Kubernetes' standard name,
// resource.kubernetes.io/pcieRoot, whose value has resclass's format
// ("pci0000:00"), so that DRA's matchAttribute constraints and other drivers'
// devices line up with it.
var standardNames = map[string]string{
	v1alpha1.AttributePCIeRoot: StandardDomain,
}

// ErrRefused is wrapped by every error of Device: the device cannot be
// published through DRA with the same meaning, and is left out.
var ErrRefused = errors.New("cannot be published through DRA")

// Where reports the DRA domain, the identifier and whether it is a capacity,
// for resclass attribute key of type t as the mapping writes it. kind and id
// are attributes in DriverName's domain.
func Where(key string, t v1alpha1.AttributeType) (domain, id string, capacity bool) {
	switch t {
	case v1alpha1.AttributeTypeQuantity:
		return DriverName, key, true
	case v1alpha1.AttributeTypeBandwidth:
		if kinds.Builtin.AttributeType(key) == v1alpha1.AttributeTypeBandwidth {
			return DriverName, key, true
		}
		return BandwidthDomain, key, true
	}
	if d, ok := standardNames[key]; ok {
		return d, key, false
	}
	return DriverName, key, false
}

func qualified(domain, id string) resourceapi.QualifiedName {
	if domain == DriverName {
		// Names without a domain are in the driver's: the shorter form is what
		// kubectl shows and what a hand-written CEL expression reads the same.
		return resourceapi.QualifiedName(id)
	}
	return resourceapi.QualifiedName(domain + "/" + id)
}

// DeviceName is the DRA device name of the resclass device id: a DNS label,
// unique in the node's pool and stable across restarts. An id that already is
// one is kept; any other is lower-cased, each run of other characters becomes
// "-", and 8 hex digits of the id's SHA-256 are appended (so "A" and "a", or
// "0000:3b:00.0" and "0000-3b-00-0", stay apart): GPU-6513270e-... becomes
// gpu-6513270e-...-<hash>, 0000:3b:00.0 becomes 0000-3b-00-0-<hash>.
func DeviceName(id string) string {
	if len(validation.IsDNS1123Label(id)) == 0 {
		return id
	}
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(id) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			dash = false
			continue
		}
		if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	sum := sha256.Sum256([]byte(id))
	suffix := hex.EncodeToString(sum[:4])
	base := strings.TrimRight(b.String(), "-")
	if limit := validation.DNS1123LabelMaxLength - len(suffix) - 1; len(base) > limit {
		base = strings.TrimRight(base[:limit], "-")
	}
	if base == "" {
		return "d-" + suffix // a label must start with a letter or digit
	}
	return base + "-" + suffix
}

// Semver writes v as the semantic version that orders and compares as v does
// (missing parts are zero, so 8.0 is 8.0.0; leading zeros go: 535.104.05 is
// 535.104.5). ok is false when v has a non-zero part after the third: a
// semantic version has three numbers, and folding the rest into a pre-release
// or build suffix would change the order.
func Semver(v attrvalue.Version) (s string, ok bool) {
	parts := strings.Split(v.String(), ".")
	for len(parts) > 3 && parts[len(parts)-1] == "0" {
		parts = parts[:len(parts)-1]
	}
	if len(parts) > 3 {
		return "", false
	}
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	return strings.Join(parts, "."), true
}

// Exact returns q in a format whose text (what a ResourceSlice or a CEL
// literal carries) reads back as q's value exactly: the canonical text of a
// binary-suffixed quantity rounds a fraction up (0.5Ki is 512, but 0.0001Ki
// would be written 1Ki), so a binary quantity with a fraction is written in
// decimal notation, exact down to 1n (attrvalue's bound).
func Exact(q resource.Quantity) resource.Quantity {
	if q.Format == resource.BinarySI && q.AsDec().Scale() > 0 {
		return *resource.NewDecimalQuantity(*q.AsDec(), resource.DecimalSI)
	}
	return q.DeepCopy()
}

// Device maps one resclass device to a DRA device, or refuses it with an error
// wrapping ErrRefused. It refuses a device when:
//   - any attribute cannot be decoded or has another type than its kind
//     declares (selector.Device.Problems: the resclass scheduler gives such a
//     device to nobody either);
//   - its id is longer than a DRA string (64 characters);
//   - an attribute is named kind or id (those names carry the device's own
//     kind and id), or its name is not a C identifier of at most 32
//     characters;
//   - a string is longer than 64 characters;
//   - a version has a non-zero part after the third (see Semver);
//   - with kind, id and what it publishes of its sharing, it has more than 32
//     attributes and capacities;
//   - it serves shares and a quantity attribute is negative (see share).
//
// An unhealthy device carries the TaintUnhealthy NoSchedule taint, one whose
// sharing mode is about to change the TaintModeChange one. A device that
// serves shares is published as share describes.
func Device(d *v1alpha1.Device) (resourceapi.Device, error) {
	refuse := func(format string, args ...any) (resourceapi.Device, error) {
		return resourceapi.Device{}, fmt.Errorf("device %q (%s) %w: %s", d.ID, d.Kind, ErrRefused, fmt.Sprintf(format, args...))
	}
	sd := selector.NewDevice(d)
	if problems := sd.Problems(); len(problems) > 0 {
		return refuse("%v", problems[0])
	}
	if d.ID == "" || d.Kind == "" {
		return refuse("it has no id or no kind")
	}
	if !utf8.ValidString(d.ID) || !utf8.ValidString(d.Kind) {
		return refuse("its id or kind is not UTF-8")
	}
	if len(d.ID) > resourceapi.DeviceAttributeMaxValueLength {
		return refuse("its id is longer than DRA's %d characters", resourceapi.DeviceAttributeMaxValueLength)
	}
	if len(d.Kind) > resourceapi.DeviceAttributeMaxValueLength {
		return refuse("its kind is longer than DRA's %d characters", resourceapi.DeviceAttributeMaxValueLength)
	}
	_, shareCap, shares := sd.Sharing()
	extra := 2 // kind and id
	if shares {
		extra++ // the mode
		if shareCap.Memory >= 0 {
			extra++
		}
		if shareCap.Compute >= 0 {
			extra++
		}
	}
	if n := len(d.Attributes) + extra; n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
		return refuse("with kind, id and its sharing it has %d attributes and capacities; DRA allows %d", n, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice)
	}
	kind, id := d.Kind, d.ID
	out := resourceapi.Device{
		Name: DeviceName(d.ID),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			AttributeKind: {StringValue: &kind},
			AttributeID:   {StringValue: &id},
		},
	}
	// Sorted, so that the first refusal reported does not depend on map order.
	names := make([]string, 0, len(d.Attributes))
	for name := range d.Attributes {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		a := d.Attributes[name]
		switch {
		case name == AttributeKind || name == AttributeID:
			return refuse("attribute %q: the name is the device's own %s in DRA", name, name)
		case len(name) > resourceapi.DeviceMaxIDLength:
			return refuse("attribute %q: DRA names are at most %d characters", name, resourceapi.DeviceMaxIDLength)
		case len(validation.IsCIdentifier(name)) > 0:
			return refuse("attribute %q: DRA names are C identifiers (letters, digits, _)", name)
		}
		domain, ident, isCapacity := Where(name, a.Type())
		qn := qualified(domain, ident)
		if isCapacity {
			var q resource.Quantity
			if a.QuantityValue != nil {
				q = Exact(*a.QuantityValue)
			} else {
				// Problems above decoded it already.
				q, _ = attrvalue.ParseBandwidth(*a.BandwidthValue)
			}
			if out.Capacity == nil {
				out.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
			}
			out.Capacity[qn] = resourceapi.DeviceCapacity{Value: q}
			continue
		}
		var v resourceapi.DeviceAttribute
		switch a.Type() {
		case v1alpha1.AttributeTypeString:
			if !utf8.ValidString(*a.StringValue) {
				return refuse("attribute %q: the string is not UTF-8", name)
			}
			if len(*a.StringValue) > resourceapi.DeviceAttributeMaxValueLength {
				return refuse("attribute %q: the string is longer than DRA's %d characters", name, resourceapi.DeviceAttributeMaxValueLength)
			}
			s := *a.StringValue
			v.StringValue = &s
		case v1alpha1.AttributeTypeInt:
			i := *a.IntValue
			v.IntValue = &i
		case v1alpha1.AttributeTypeBool:
			b := *a.BoolValue
			v.BoolValue = &b
		case v1alpha1.AttributeTypeVersion:
			parsed, _ := attrvalue.ParseVersion(*a.VersionValue) // Problems above decoded it
			s, ok := Semver(parsed)
			if !ok {
				return refuse("attribute %q: version %s has more than three parts, which a DRA (semantic) version cannot order", name, *a.VersionValue)
			}
			v.VersionValue = &s
		}
		out.Attributes[qn] = v
	}
	if shares {
		if err := share(&out, d.Sharing.Mode, shareCap); err != nil {
			return refuse("%v", err)
		}
	}
	if !d.Healthy {
		out.Taints = append(out.Taints, resourceapi.DeviceTaint{Key: TaintUnhealthy, Effect: resourceapi.DeviceTaintEffectNoSchedule})
	}
	if s := d.Sharing; s != nil && s.RequestedMode != "" && s.RequestedMode != s.Mode {
		out.Taints = append(out.Taints, resourceapi.DeviceTaint{Key: TaintModeChange, Effect: resourceapi.DeviceTaintEffectNoSchedule})
	}
	return out, nil
}

// share makes out a device that serves shares (KEP-5075, DRAConsumableCapacity,
// beta and on by default in Kubernetes 1.36): allowMultipleAllocations, the
// attribute AttributeShareMode, and the capacities of ShareDomain that c
// publishes, in whole bytes and percent as pkg/selector counts them, each
// with a requestPolicy: any multiple of its step (shareMemoryStep,
// shareComputeStep; any amount for a capacity smaller than one step) up to
// the capacity, and 0 by default. The default is what
// a claim that does not request the capacity consumes, so a class's share
// that takes no compute takes none on DRA either; a claim that requests
// nothing at all consumes nothing, and the kubelet plugin refuses to prepare
// it. A device that allows several allocations has all its capacities
// consumed, and one without a policy whole by a claim that does not request
// it: the capacities the device's own attributes carry (memory, the GPU's
// memory) say what the device is, are not shared out, and are given the
// policy "only 0", so that every claim consumes none of them.
func share(out *resourceapi.Device, mode v1alpha1.SharingMode, c selector.Capacity) error {
	zero := resource.MustParse("0")
	for name, dc := range out.Capacity {
		if dc.Value.Sign() < 0 {
			return fmt.Errorf("capacity %s is negative (%s), which a device that allows several allocations cannot publish", name, dc.Value.String())
		}
		dc.RequestPolicy = &resourceapi.CapacityRequestPolicy{Default: ptr(zero.DeepCopy()), ValidValues: []resource.Quantity{zero.DeepCopy()}}
		out.Capacity[name] = dc
	}
	m := string(mode)
	out.Attributes[qualified(ShareDomain, AttributeShareMode)] = resourceapi.DeviceAttribute{StringValue: &m}
	out.AllowMultipleAllocations = ptr(true)
	add := func(name string, v int64, format resource.Format, step resource.Quantity) {
		value := resource.NewQuantity(v, format)
		r := &resourceapi.CapacityRequestPolicyRange{Min: ptr(zero.DeepCopy())}
		if step.CmpInt64(v) <= 0 { // the apiserver wants min+step within the capacity
			r.Step = ptr(step.DeepCopy())
		}
		if out.Capacity == nil {
			out.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
		}
		out.Capacity[qualified(ShareDomain, name)] = resourceapi.DeviceCapacity{
			Value:         *value,
			RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: ptr(zero.DeepCopy()), ValidRange: r},
		}
	}
	if c.Memory >= 0 {
		add(v1alpha1.CapacityMemory, c.Memory, resource.BinarySI, shareMemoryStep)
	}
	if c.Compute >= 0 {
		add(v1alpha1.CapacityCompute, c.Compute, resource.DecimalSI, shareComputeStep)
	}
	return nil
}

// ShareCapacity is the name, in a DRA device's capacity, of the share
// capacity name (v1alpha1.CapacityMemory, v1alpha1.CapacityCompute).
func ShareCapacity(name string) resourceapi.QualifiedName { return qualified(ShareDomain, name) }

func ptr[T any](v T) *T { return &v }

// Devices maps a node's devices in order. A device Device refuses is left out
// and its error returned in refused, as is a device whose DRA name another
// device already has (two ids that differ only where DeviceName replaces,
// with colliding hashes: not expected, but never published twice).
func Devices(devices []v1alpha1.Device) (out []resourceapi.Device, refused []error) {
	seen := make(map[string]string, len(devices))
	for i := range devices {
		dev, err := Device(&devices[i])
		if err != nil {
			refused = append(refused, err)
			continue
		}
		if other, dup := seen[dev.Name]; dup {
			refused = append(refused, fmt.Errorf("device %q (%s) %w: its DRA name %s is also device %q's", devices[i].ID, devices[i].Kind, ErrRefused, dev.Name, other))
			continue
		}
		seen[dev.Name] = devices[i].ID
		out = append(out, dev)
	}
	return out, refused
}

// ID returns the resclass id of a DRA device the mapping wrote.
func ID(d *resourceapi.Device) (string, bool) {
	a, ok := d.Attributes[AttributeID]
	if !ok || a.StringValue == nil {
		return "", false
	}
	return *a.StringValue, true
}

// IDs maps the resclass ids the slices of this driver publish to their DRA
// device names.
func IDs(slices []resourceapi.ResourceSlice) map[string]string {
	out := map[string]string{}
	for _, s := range slices {
		if s.Spec.Driver != DriverName {
			continue
		}
		for i := range s.Spec.Devices {
			if id, ok := ID(&s.Spec.Devices[i]); ok {
				out[id] = s.Spec.Devices[i].Name
			}
		}
	}
	return out
}
