package draplugin

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/internal/sealed"
)

// CheckpointFile is the plugin's record of the claims it prepared, in its
// plugin data directory (/var/lib/kubelet/plugins/<driver>/).
const CheckpointFile = "checkpoint.json"

// checkpointVersion is the format written; another is refused.
const checkpointVersion = "resclass.io/dra-checkpoint/v1"

// Bounds of what a checkpoint may hold. The file crosses a trust boundary
// (anyone who can write the kubelet's plugin directory can write it), so it
// is read with bounded cost: 16 MiB at most, and each list and string
// bounded before anything is kept. A node with 110 pods of eight devices
// each writes well under 1 MiB.
const (
	maxCheckpointBytes = 16 << 20
	maxClaims          = 16384
	maxDevicesPerClaim = 1024
	maxCDIIDsPerDevice = 64
	maxStringLen       = 1024
	// maxPodsPerClaim is the API's bound on a claim's status.reservedFor.
	maxPodsPerClaim = resourceapi.ResourceClaimReservedForMaxSize
)

// PreparedDevice is one device of a prepared claim.
type PreparedDevice struct {
	// Request is the claim's request (or subrequest) the device serves.
	Request string `json:"request"`
	// Pool and Device name the device in the driver's ResourceSlices.
	Pool   string `json:"pool"`
	Device string `json:"device"`
	// ID is the resclass device id (NodeDevices' id: a GPU UUID, a PCI
	// address, a hugepage pool).
	ID string `json:"id"`
	// CDIDeviceIDs are what the kubelet passes to the runtime for it.
	CDIDeviceIDs []string `json:"cdiDeviceIDs,omitempty"`
	// Share is what the claim takes of a device that serves shares
	// (share.go), by capacity name; nil when it has the device whole.
	Share assignment.Share `json:"share,omitempty"`
	// Class is the ResourceClass the request's DeviceClass stands for (the
	// device_holder series' class); empty in checkpoints of agents before it.
	Class string `json:"class,omitempty"`
}

// PreparedClaim is a claim the plugin prepared and not yet unprepared.
type PreparedClaim struct {
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	Devices   []PreparedDevice `json:"devices"`
	// Pods are the pods the claim was reserved for when last prepared
	// (status.reservedFor): the holders the device_holder series names.
	Pods []string `json:"pods,omitempty"`
}

// Checkpoint is what survives a restart of the agent and of the kubelet: the
// claims prepared, by UID. The kubelet asks to prepare again after its own
// restart (the answer must be the same) and to unprepare claims whose objects
// may be gone (only the checkpoint knows their devices).
type Checkpoint struct {
	Claims map[types.UID]PreparedClaim `json:"claims"`
}

// Marshal renders the checkpoint in its envelope (pkg/internal/sealed: a
// version and the data's SHA-256, so that a torn or edited file is noticed
// rather than believed).
func (c *Checkpoint) Marshal() ([]byte, error) {
	if c.Claims == nil {
		c.Claims = map[types.UID]PreparedClaim{}
	}
	return sealed.Marshal(checkpointVersion, c)
}

// ParseCheckpoint reads a checkpoint written by Marshal, refusing, with a
// message that says why, anything else: another version, a checksum that
// does not match, more than the bounds allow, a claim or device without its
// names, a share out of bounds, one device in two claims unless as shares.
func ParseCheckpoint(blob []byte) (*Checkpoint, error) {
	var c Checkpoint
	if err := sealed.Unmarshal(blob, checkpointVersion, maxCheckpointBytes, &c); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if c.Claims == nil {
		c.Claims = map[types.UID]PreparedClaim{}
	}
	return &c, nil
}

func (c *Checkpoint) validate() error {
	if len(c.Claims) > maxClaims {
		return fmt.Errorf("%d claims, at most %d", len(c.Claims), maxClaims)
	}
	type holder struct {
		uid   types.UID
		whole bool
	}
	owner := map[string]holder{} // pool/device -> a claim of it
	for _, uid := range slices.Sorted(maps.Keys(c.Claims)) {
		pc := c.Claims[uid]
		if err := checkString("claim uid", string(uid)); err != nil {
			return err
		}
		if errs := validation.IsDNS1123Subdomain(pc.Name); len(errs) > 0 {
			return fmt.Errorf("claim %s: name %.64q: %s", uid, pc.Name, errs[0])
		}
		if errs := validation.IsDNS1123Label(pc.Namespace); len(errs) > 0 {
			return fmt.Errorf("claim %s: namespace %.64q: %s", uid, pc.Namespace, errs[0])
		}
		if len(pc.Pods) > maxPodsPerClaim {
			return fmt.Errorf("claim %s: %d pods, at most %d", uid, len(pc.Pods), maxPodsPerClaim)
		}
		for _, pod := range pc.Pods {
			if errs := validation.IsDNS1123Subdomain(pod); len(errs) > 0 {
				return fmt.Errorf("claim %s: pod %.64q: %s", uid, pod, errs[0])
			}
		}
		if len(pc.Devices) > maxDevicesPerClaim {
			return fmt.Errorf("claim %s: %d devices, at most %d", uid, len(pc.Devices), maxDevicesPerClaim)
		}
		for _, d := range pc.Devices {
			if errs := validation.IsDNS1123Subdomain(d.Class); d.Class != "" && len(errs) > 0 {
				return fmt.Errorf("claim %s: device %s: class %.64q: %s", uid, d.Device, d.Class, errs[0])
			}
			for what, s := range map[string]string{"request": d.Request, "pool": d.Pool, "device": d.Device, "id": d.ID} {
				if err := checkString(what, s); err != nil {
					return fmt.Errorf("claim %s: %w", uid, err)
				}
			}
			if len(d.CDIDeviceIDs) > maxCDIIDsPerDevice {
				return fmt.Errorf("claim %s: device %s: %d CDI devices, at most %d", uid, d.Device, len(d.CDIDeviceIDs), maxCDIIDsPerDevice)
			}
			for _, id := range d.CDIDeviceIDs {
				if err := checkString("CDI device", id); err != nil {
					return fmt.Errorf("claim %s: %w", uid, err)
				}
			}
			if err := checkShare(d.Share); err != nil {
				return fmt.Errorf("claim %s: device %s: %w", uid, d.Device, err)
			}
			// A device is in several claims only as shares of it.
			key := d.Pool + "/" + d.Device
			if other, ok := owner[key]; ok && other.uid != uid && (other.whole || d.Share == nil) {
				return fmt.Errorf("device %s is prepared for claims %s and %s, not as shares", key, other.uid, uid)
			}
			owner[key] = holder{uid, d.Share == nil}
		}
	}
	return nil
}

// checkShare bounds a share: memory and compute only, each more than 0,
// memory at most 1Ei (v1alpha1.MaxShareMemoryBytes), compute at most 100.
func checkShare(s assignment.Share) error {
	if s == nil {
		return nil
	}
	if len(s) == 0 {
		return errors.New("a share of nothing")
	}
	for name, v := range s {
		limit := map[string]int64{v1alpha1.CapacityMemory: v1alpha1.MaxShareMemoryBytes, v1alpha1.CapacityCompute: 100}[name]
		if limit == 0 {
			return fmt.Errorf("share of %.64q, which is no share capacity", name)
		}
		if v <= 0 || v > limit {
			return fmt.Errorf("share of %s %d, not from 1 to %d", name, v, limit)
		}
	}
	return nil
}

func checkString(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("empty %s", what)
	case len(s) > maxStringLen:
		return fmt.Errorf("%s of %d bytes, at most %d", what, len(s), maxStringLen)
	}
	return nil
}

// LoadCheckpoint reads the checkpoint at path; a missing file is an empty
// checkpoint (a node's first start).
func LoadCheckpoint(path string) (*Checkpoint, error) {
	blob, err := readCheckpoint(path)
	if errors.Is(err, os.ErrNotExist) {
		return &Checkpoint{Claims: map[types.UID]PreparedClaim{}}, nil
	}
	if err != nil {
		return nil, err
	}
	c, err := ParseCheckpoint(blob)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Save writes the checkpoint to path atomically (a temporary file renamed
// over it, synced first): a crash leaves the old file or the new one.
func (c *Checkpoint) Save(path string) error {
	blob, err := c.Marshal()
	if err != nil {
		return err
	}
	return sealed.WriteFile(path, blob)
}
