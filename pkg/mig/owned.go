package mig

import (
	"fmt"
	"slices"
	"unicode"

	"github.com/resclass/resclass/pkg/internal/sealed"
)

// The node agent's ownership record (docs/mig.md, "Creation and ownership").
// NVML does not record who created a GPU instance, and the agent must never
// destroy one it did not create: it keeps, on the node, the instances it
// created and for which pod. The file crosses a trust boundary (whoever
// writes the agent's host directory), so it is read as the DRA checkpoint is:
// a version, the SHA-256 of its data, strict JSON, bounds, and every entry
// checked; a record that cannot be believed is refused with the reason.

// Owned is a GPU instance the node agent created for a pod.
type Owned struct {
	// GPU is the parent GPU's UUID.
	GPU string `json:"gpu"`
	// Profile and Start are the instance's profile and first memory slice.
	Profile string `json:"profile"`
	Start   int    `json:"start"`
	// GPUInstance is NVML's id of the GPU instance on its GPU.
	GPUInstance uint32 `json:"gpuInstance"`
	// Device is the MIG device's UUID, once its compute instance exists.
	Device string `json:"device,omitempty"`
	// Pod is the UID of the pod it was created for.
	Pod string `json:"pod"`
}

// Record is the instances the agent created and has not destroyed.
type Record struct {
	Instances []Owned `json:"instances"`
}

const (
	recordVersion = "resclass.io/mig-owned/v1"
	// MaxRecordBytes and maxOwned bound the file: 64 GPUs of 8 instances.
	MaxRecordBytes = 256 << 10
	maxOwned       = 512
	maxIDLen       = 128
)

// Marshal renders r in its envelope (pkg/internal/sealed); it refuses a
// record ParseRecord would.
func (r *Record) Marshal() ([]byte, error) {
	if err := r.validate(); err != nil {
		return nil, err
	}
	if r.Instances == nil {
		r.Instances = []Owned{}
	}
	return sealed.Marshal(recordVersion, r)
}

// ParseRecord reads a record Marshal wrote, refusing anything else with a
// message that says why: another version, a checksum that does not match,
// more than the bounds, an entry without its names or out of the slices, one
// instance (a GPU's start or instance id) listed twice.
func ParseRecord(blob []byte) (*Record, error) {
	var r Record
	if err := sealed.Unmarshal(blob, recordVersion, MaxRecordBytes, &r); err != nil {
		return nil, fmt.Errorf("MIG ownership record: %w", err)
	}
	if err := r.validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

func (r *Record) validate() error {
	if len(r.Instances) > maxOwned {
		return fmt.Errorf("MIG ownership record: %d instances, at most %d", len(r.Instances), maxOwned)
	}
	type slot struct {
		gpu string
		n   int
	}
	starts, ids := map[slot]bool{}, map[slot]bool{}
	for i, o := range r.Instances {
		for what, s := range map[string]string{"gpu": o.GPU, "profile": o.Profile, "pod": o.Pod, "device": o.Device} {
			if s == "" && what != "device" || len(s) > maxIDLen || slices.ContainsFunc([]rune(s), func(c rune) bool { return c > unicode.MaxASCII || !unicode.IsPrint(c) }) {
				return fmt.Errorf("MIG ownership record: instance %d: %s %.64q empty, longer than %d or not printable ASCII", i, what, s, maxIDLen)
			}
		}
		if o.Start < 0 || o.Start >= Slots {
			return fmt.Errorf("MIG ownership record: instance %d: start %d outside the %d slices", i, o.Start, Slots)
		}
		if starts[slot{o.GPU, o.Start}] || ids[slot{o.GPU, int(o.GPUInstance)}] {
			return fmt.Errorf("MIG ownership record: GPU %s: the instance at %d (id %d) listed twice", o.GPU, o.Start, o.GPUInstance)
		}
		starts[slot{o.GPU, o.Start}], ids[slot{o.GPU, int(o.GPUInstance)}] = true, true
	}
	return nil
}

// Existing is a GPU instance NVML lists now.
type Existing struct {
	GPU         string
	Profile     string
	Start       int
	GPUInstance uint32
}

// Reconcile decides what becomes of each instance the record lists, given
// the instances NVML lists now and whether a pod still holds what was made
// for it: keep (it exists and its pod is live), destroy (it exists and no
// pod holds it any more) or forget (it is gone: destroyed, or the GPU reset,
// behind the agent's back). An instance is the record's only when its GPU,
// start, profile and instance id all match: an instance in the same place
// that someone else made after ours went is not ours. Instances NVML lists
// that the record does not are never in the answer: the agent leaves them
// alone.
func Reconcile(r *Record, existing []Existing, live func(pod string) bool) (keep, destroy, forget []Owned) {
	for _, o := range r.Instances {
		found := slices.ContainsFunc(existing, func(e Existing) bool {
			return e.GPU == o.GPU && e.Start == o.Start && e.Profile == o.Profile && e.GPUInstance == o.GPUInstance
		})
		switch {
		case !found:
			forget = append(forget, o)
		case live(o.Pod):
			keep = append(keep, o)
		default:
			destroy = append(destroy, o)
		}
	}
	return keep, destroy, forget
}
