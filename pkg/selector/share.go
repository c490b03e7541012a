package selector

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/attrvalue"
)

// Share is a share class's unit (v1alpha1.ResourceShare) in numbers: what one
// unit takes of one device, 0 for a capacity it does not take.
type Share struct {
	Memory  int64 // bytes
	Compute int64 // percent
}

// Capacity is what the shares of one device may take together: its
// DeviceSharing.Capacity in numbers, -1 for a capacity it does not publish.
type Capacity struct {
	Memory  int64
	Compute int64
}

// Fits reports whether units of s fit within c, and, when not, why. It
// divides rather than multiplies, so that no request, however large,
// overflows.
func (s Share) Fits(units int64, c Capacity) (bool, string) {
	if units <= 0 {
		return true, ""
	}
	if s.Memory > 0 {
		if c.Memory < 0 {
			return false, "the device publishes no memory capacity to share"
		}
		if units > c.Memory/s.Memory {
			return false, fmt.Sprintf("%d units of %d bytes of memory are more than the device's %d", units, s.Memory, c.Memory)
		}
	}
	if s.Compute > 0 {
		if c.Compute < 0 {
			return false, "the device publishes no compute capacity to share"
		}
		if units > c.Compute/s.Compute {
			return false, fmt.Sprintf("%d units of %d%% compute are more than the device's %d%%", units, s.Compute, c.Compute)
		}
	}
	return true, ""
}

// Times is units of s, memory and compute each multiplied; the caller has
// checked with Fits that the product fits a device, so it does not
// overflow.
func (s Share) Times(units int64) Share {
	return Share{Memory: s.Memory * units, Compute: s.Compute * units}
}

// compileShare reads a class's share unit.
func compileShare(s *v1alpha1.ResourceShare, path *field.Path) (*Share, field.ErrorList) {
	if s == nil {
		return nil, nil
	}
	var errs field.ErrorList
	out := &Share{}
	if s.Memory != nil {
		// The CRD's schema bounds the spelling; a value a client sent past it
		// (or a test wrote) is checked here too.
		if err := attrvalue.CheckQuantity(*s.Memory); err != nil {
			errs = append(errs, field.Invalid(path.Child("memory"), s.Memory.String(), err.Error()))
		} else if v := s.Memory.Value(); v <= 0 || v > v1alpha1.MaxShareMemoryBytes {
			errs = append(errs, field.Invalid(path.Child("memory"), s.Memory.String(), "must be more than 0 and at most 1Ei"))
		} else {
			out.Memory = v
		}
	}
	if s.Compute != nil {
		if v := *s.Compute; v < 1 || v > 100 {
			errs = append(errs, field.Invalid(path.Child("compute"), v, "must be a percentage from 1 to 100"))
		} else {
			out.Compute = int64(v)
		}
	}
	if s.Memory == nil && s.Compute == nil {
		errs = append(errs, field.Required(path, "a share takes memory, compute or both"))
	}
	return out, errs
}

// sharing is what a device publishes of its sharing that selection reads.
type sharing struct {
	mode     v1alpha1.SharingMode
	capacity Capacity
}

// decodeSharing reads d's sharing: nil for a device served whole, a problem
// for capacities it cannot read (the device is then given to nobody).
func decodeSharing(s *v1alpha1.DeviceSharing) (*sharing, error) {
	if s == nil || !s.Mode.Shares() {
		return nil, nil
	}
	out := &sharing{mode: s.Mode, capacity: Capacity{Memory: -1, Compute: -1}}
	for name, q := range s.Capacity {
		if err := attrvalue.CheckQuantity(q); err != nil || q.Sign() < 0 {
			return nil, fmt.Errorf("sharing capacity %s: %s is not a capacity (0 to 4Ei)", name, q.String())
		}
		switch name {
		case v1alpha1.CapacityMemory:
			out.capacity.Memory = q.Value()
		case v1alpha1.CapacityCompute:
			if v := q.Value(); v > 100 {
				return nil, fmt.Errorf("sharing capacity compute: %d is more than 100 percent", v)
			}
			out.capacity.Compute = q.Value()
		}
	}
	return out, nil
}

// Share is the class's unit, for a share class.
func (c *Class) Share() (Share, bool) {
	if c.share == nil {
		return Share{}, false
	}
	return *c.share, true
}

// Sharing is the device's sharing mode and the capacity its shares may take;
// ok is false for a device served whole.
func (d *Device) Sharing() (mode v1alpha1.SharingMode, c Capacity, ok bool) {
	if d.sharing == nil {
		return v1alpha1.SharingExclusive, Capacity{}, false
	}
	return d.sharing.mode, d.sharing.capacity, true
}

// servesClass: a share class selects only devices that serve shares and have
// room for one unit; a class without a share only devices served whole; a
// potential MIG slice only a class with createMIG.
func (c *Class) servesClass(d *Device) bool {
	if d.potential {
		return c.createMIG
	}
	if c.share == nil {
		return d.sharing == nil
	}
	if d.sharing == nil {
		return false
	}
	fits, _ := c.share.Fits(1, d.sharing.capacity)
	return fits
}

// whyNotServed says why servesClass is false.
func (c *Class) whyNotServed(d *Device) string {
	switch {
	case d.potential:
		return "the device is a MIG slice not created yet, and the class does not set createMIG"
	case c.share == nil:
		return fmt.Sprintf("the device serves shares (%s) and the class takes whole devices", d.sharing.mode)
	case d.sharing == nil:
		return "the device is served whole (sharing mode Exclusive) and the class takes shares"
	}
	_, why := c.share.Fits(1, d.sharing.capacity)
	return "one unit of the class's share does not fit the device: " + why
}

// CreatesMIG says whether the class selects potential MIG slices
// (spec.createMIG).
func (c *Class) CreatesMIG() bool { return c.createMIG }
