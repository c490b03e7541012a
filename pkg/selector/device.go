package selector

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/attrvalue"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
)

// typed is one decoded value of a known type: a device attribute, or one reading of
// a selector value. The quantity and the version are behind pointers, set for
// their types only: the scheduler keeps one typed per attribute of every device
// of every node, and inline they made it 144 bytes instead of 64.
type typed struct {
	typ v1alpha1.AttributeType
	s   string             // string
	i   int64              // int
	b   bool               // bool
	q   *resource.Quantity // quantity, bandwidth
	v   *attrvalue.Version // version
}

// attribute is a device attribute as the selector sees it. err is set when the
// device published a value that cannot be decoded (or a well-known attribute with
// the wrong type): the attribute then exists but matches no comparison.
type attribute struct {
	typed
	err error
}

// Device is a device prepared for matching: its attributes decoded once, so that
// evaluating any number of classes against it does not parse or allocate. Build it
// with NewDevice whenever the published device changes.
type Device struct {
	ID      string
	Kind    string
	Healthy bool
	// attrs are sorted by name, in one slice: a map per device took several
	// times the memory (docs/scheduler.md, "5000 nodes and the scheduler's heap").
	attrs []namedAttribute
	// sharing is nil for a device served whole (most devices: kept small).
	sharing    *sharing
	sharingErr error
	// potential: a MIG slice not created yet (mig.Potentials), which only a
	// class with createMIG selects.
	potential bool
}

type namedAttribute struct {
	name string
	attribute
}

// NewDevice decodes d's attributes. It never fails: an attribute that cannot be
// decoded is kept and reported by Problems, and no comparison against it matches.
func NewDevice(d *v1alpha1.Device) *Device {
	dev := &Device{ID: d.ID, Kind: d.Kind, Healthy: d.Healthy, attrs: make([]namedAttribute, 0, len(d.Attributes))}
	for name, a := range d.Attributes {
		dev.attrs = append(dev.attrs, namedAttribute{name: name, attribute: decodeAttribute(name, a)})
	}
	slices.SortFunc(dev.attrs, func(a, b namedAttribute) int { return strings.Compare(a.name, b.name) })
	dev.sharing, dev.sharingErr = decodeSharing(d.Sharing)
	return dev
}

// NewPotentialDevice decodes a potential MIG slice (mig.Potentials): a
// device only classes with createMIG select.
func NewPotentialDevice(d *v1alpha1.Device) *Device {
	dev := NewDevice(d)
	dev.potential = true
	return dev
}

// Potential says whether d is a MIG slice not created yet.
func (d *Device) Potential() bool { return d.potential }

// attr is the attribute called name, if the device has it.
func (d *Device) attr(name string) (attribute, bool) {
	i, ok := slices.BinarySearchFunc(d.attrs, name, func(a namedAttribute, name string) int { return strings.Compare(a.name, name) })
	if !ok {
		return attribute{}, false
	}
	return d.attrs[i].attribute, true
}

func decodeAttribute(name string, a v1alpha1.DeviceAttribute) attribute {
	t := a.Type()
	if t == "" {
		return attribute{err: fmt.Errorf("attribute %q: exactly one of string, int, bool, quantity, bandwidth, version must be set", name)}
	}
	if want := kinds.Builtin.AttributeType(name); want != "" && want != t {
		return attribute{err: fmt.Errorf("attribute %q: published as %s, but it is a %s", name, t, want)}
	}
	var out attribute
	out.typ = t
	switch t {
	case v1alpha1.AttributeTypeString:
		out.s = *a.StringValue
	case v1alpha1.AttributeTypeInt:
		out.i = *a.IntValue
	case v1alpha1.AttributeTypeBool:
		out.b = *a.BoolValue
	case v1alpha1.AttributeTypeQuantity:
		// Decoding JSON never bounds a quantity's exponent: check it before
		// anything compares it.
		if err := attrvalue.CheckQuantity(*a.QuantityValue); err != nil {
			return attribute{err: fmt.Errorf("attribute %q: the quantity is %w", name, err)}
		}
		// A copy: the published object is shared, and Quantity.String
		// caches into its receiver.
		q := a.QuantityValue.DeepCopy()
		out.q = &q
	case v1alpha1.AttributeTypeBandwidth:
		q, err := attrvalue.ParseBandwidth(*a.BandwidthValue)
		if err != nil {
			return attribute{err: fmt.Errorf("attribute %q: %w", name, err)}
		}
		out.q = &q
	case v1alpha1.AttributeTypeVersion:
		v, err := attrvalue.ParseVersion(*a.VersionValue)
		if err != nil {
			return attribute{err: fmt.Errorf("attribute %q: %w", name, err)}
		}
		out.v = &v
	}
	return out
}

// Problems lists the attributes of the device that could not be decoded, sorted.
// The scheduler gives out no device that has any: what it publishes is not what
// a class may rely on.
func (d *Device) Problems() []error {
	var errs []error
	for _, a := range d.attrs {
		if a.err != nil {
			errs = append(errs, a.err)
		}
	}
	if d.sharingErr != nil {
		errs = append(errs, d.sharingErr)
	}
	return errs
}

// String renders a decoded value for messages.
func (t typed) String() string {
	switch t.typ {
	case v1alpha1.AttributeTypeString:
		return fmt.Sprintf("%q", t.s)
	case v1alpha1.AttributeTypeInt:
		return fmt.Sprint(t.i)
	case v1alpha1.AttributeTypeBool:
		return fmt.Sprint(t.b)
	case v1alpha1.AttributeTypeQuantity:
		q := *t.q // String caches into its receiver, which is shared
		return q.String()
	case v1alpha1.AttributeTypeBandwidth:
		q := *t.q
		if v, ok := q.AsInt64(); ok {
			return attrvalue.FormatBandwidth(v)
		}
		return q.String() + "bps"
	case v1alpha1.AttributeTypeVersion:
		return t.v.String()
	}
	return "<invalid>"
}

// compare orders two values of the same type: -1, 0, +1. ok is false when the type
// has no order (string, bool) — those only compare for equality.
func compare(a, b *typed) (c int, ordered bool) {
	switch a.typ {
	case v1alpha1.AttributeTypeInt:
		switch {
		case a.i < b.i:
			return -1, true
		case a.i > b.i:
			return 1, true
		}
		return 0, true
	case v1alpha1.AttributeTypeQuantity, v1alpha1.AttributeTypeBandwidth:
		// On copies: Cmp may convert its receiver (AsDec), and a device's
		// quantity is shared by every goroutine that matches it.
		x, y := *a.q, *b.q
		return x.Cmp(y), true
	case v1alpha1.AttributeTypeVersion:
		return a.v.Compare(*b.v), true
	}
	return 0, false
}

func equal(a, b *typed) bool {
	switch a.typ {
	case v1alpha1.AttributeTypeString:
		return a.s == b.s
	case v1alpha1.AttributeTypeBool:
		return a.b == b.b
	}
	c, _ := compare(a, b)
	return c == 0
}

func isOrdered(t v1alpha1.AttributeType) bool {
	switch t {
	case v1alpha1.AttributeTypeInt, v1alpha1.AttributeTypeQuantity, v1alpha1.AttributeTypeBandwidth, v1alpha1.AttributeTypeVersion:
		return true
	}
	return false
}
