package mig

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// Inherited are the parent GPU's attributes a MIG device carries too, created
// or potential, so that a class selects MIG devices by the same keys as GPUs
// (product, driver, NUMA node).
var Inherited = []string{
	v1alpha1.AttributeProduct,
	v1alpha1.AttributeArchitecture,
	v1alpha1.AttributeComputeCapability,
	v1alpha1.AttributeDriverVersion,
	v1alpha1.AttributeCUDADriverVersion,
	v1alpha1.AttributeNUMANode,
	v1alpha1.AttributePCIAddress,
}

// ErrPlacementTaken is a slice's creation refused because its memory slices
// are taken: by an instance made behind the agent's back, most likely.
var ErrPlacementTaken = errors.New("the placement is taken on the GPU")

// sliceInfix separates a potential slice's GPU from its profile and start in
// its id: "<GPU UUID>/mig/<profile>@<start>".
const sliceInfix = "/mig/"

// maxIDLength is the longest device id NodeDevices and the assignment
// allow.
const maxIDLength = 128

// SliceID is the id of the potential slice of profile at start on gpu: the
// device id the assignment names and the kubelet is given before the slice
// exists (docs/mig.md).
func SliceID(gpu, profile string, start int) string {
	return gpu + sliceInfix + profile + "@" + strconv.Itoa(start)
}

// ParseSliceID reads an id SliceID wrote; ok is false for any other id
// (those of existing devices among them).
func ParseSliceID(id string) (gpu, profile string, start int, ok bool) {
	gpu, rest, found := strings.Cut(id, sliceInfix)
	if !found || gpu == "" {
		return "", "", 0, false
	}
	at := strings.LastIndexByte(rest, '@')
	if at <= 0 || at != len(rest)-2 || !profileName(rest[:at]) {
		return "", "", 0, false
	}
	start = int(rest[at+1] - '0')
	if start < 0 || start >= Slots {
		return "", "", 0, false
	}
	return gpu, rest[:at], start, true
}

// profileName: the names NVML's profiles get ("1g.10gb", "1g.10gb+me"), and
// nothing that could make an id ambiguous.
func profileName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '+' || r == '-' || r == '_'
		if !ok {
			return false
		}
	}
	return true
}

// Potential is one slice that could be created on a GPU marked for dynamic
// MIG: a device of kind nvidia-mig that classes with createMIG select, and
// the instance it would be.
type Potential struct {
	Device   v1alpha1.Device
	Instance Instance
}

// Dynamic says whether gpu is a GPU in MIG mode that the operator marked for
// dynamic MIG and that publishes a geometry.
func Dynamic(gpu *v1alpha1.Device) bool {
	if gpu.Kind != v1alpha1.DeviceKindNvidiaGPU || gpu.MIG == nil || gpu.MIG.Mode != v1alpha1.MIGDynamic {
		return false
	}
	b := gpu.Attributes[v1alpha1.AttributeMIGEnabled].BoolValue
	return b != nil && *b
}

// Potentials is the GPU gpu's geometry describes (its table and the
// instances on it) and its potential slices: for a Dynamic GPU, one per
// profile and placement, smallest profile first, whether free now or not
// (which ones are is the GPU's state, placement's business). A profile's
// memory is the profile's figure (docs/mig.md, "Which memory selectors
// see"). It fails when the geometry cannot be believed; nil, nil for a GPU
// that is not Dynamic.
func Potentials(gpu *v1alpha1.Device) (*GPU, []Potential, error) {
	if !Dynamic(gpu) {
		return nil, nil, nil
	}
	product := gpu.ID
	if p := gpu.Attributes[v1alpha1.AttributeProduct].StringValue; p != nil {
		product = *p
	}
	g, err := FromAPI(product, gpu.MIG)
	if err != nil {
		return nil, nil, err
	}
	var out []Potential
	for i := range g.Table.Profiles {
		p := &g.Table.Profiles[i]
		if !profileName(p.Name) {
			return nil, nil, fmt.Errorf("profile %q: not a MIG profile name (lower-case letters, digits, '.', '+', '-', '_')", p.Name)
		}
		for _, start := range p.Starts {
			if id := SliceID(gpu.ID, p.Name, start); len(id) > maxIDLength {
				return nil, nil, fmt.Errorf("slice id %.40q... is longer than the %d characters a device id may have", id, maxIDLength)
			}
			out = append(out, Potential{Device: potentialDevice(gpu, p, start), Instance: Instance{p, start}})
		}
	}
	if len(out) == 0 {
		return nil, nil, errors.New("the GPU lists no MIG profile")
	}
	return g, out, nil
}

// potentialDevice is the device the slice of p at start on gpu would be.
func potentialDevice(gpu *v1alpha1.Device, p *Profile, start int) v1alpha1.Device {
	attrs := map[string]v1alpha1.DeviceAttribute{
		v1alpha1.AttributeParent:     v1alpha1.StringAttribute(gpu.ID),
		v1alpha1.AttributeMIGProfile: v1alpha1.StringAttribute(p.Name),
		v1alpha1.AttributeMemory:     v1alpha1.QuantityAttribute(*resource.NewQuantity(p.MemoryMiB<<20, resource.BinarySI)),
	}
	for name, v := range map[string]int{
		v1alpha1.AttributeMultiprocessors: p.Multiprocessors,
		v1alpha1.AttributeDecoders:        p.Decoders,
		v1alpha1.AttributeJPEGs:           p.JPEGs,
		v1alpha1.AttributeOFAs:            p.OFAs,
	} {
		attrs[name] = v1alpha1.IntAttribute(int64(v))
	}
	for _, name := range Inherited {
		if a, ok := gpu.Attributes[name]; ok {
			attrs[name] = *a.DeepCopy()
		}
	}
	return v1alpha1.Device{ID: SliceID(gpu.ID, p.Name, start), Kind: v1alpha1.DeviceKindNvidiaMIG, Healthy: gpu.Healthy, Attributes: attrs}
}
