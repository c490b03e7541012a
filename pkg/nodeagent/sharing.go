package nodeagent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/mpsstate"
)

// Reasons of the Events that sharing mode changes record on the Node.
const (
	reasonSharingWaiting = "SharingModeChangeWaiting"
	reasonSharingChanged = "SharingModeChanged"
)

// reasonMPSNotRunning is the health reason of a GPU in MPS mode whose
// control daemon does not run: the scheduler gives an unhealthy device to no
// new pod, and the pods that hold it keep it. It is the same at every pass
// (the details are in Sharing.Message), so that one DeviceUnhealthy Event
// says it.
const reasonMPSNotRunning = "MPS control daemon not running"

// maxHoldersNamed bounds the pods a waiting mode change names.
const maxHoldersNamed = 3

// maxSharingMessage is DeviceSharing.Message's bound in the API.
const maxSharingMessage = 1024

// sharingModes decides each GPU's sharing mode (docs/sharing.md) from the
// Node's labels and what pods hold, at every publish pass, and remembers the
// mode in force between passes. A label change is applied live, at the next
// pass (the Node's informer triggers one): unlike the device mode, the
// endpoints, the allocator and the CDI spec serve every sharing mode, and a
// republished NodeDevices is all the scheduler needs.
//
// The mode in force changes only when no pod holds the GPU. After a restart
// it is read back from what the agent published before (the NodeDevices
// object, which the scheduler acted on); without it, it is derived from what
// pods hold: a GPU held whole is exclusive, one held in shares is in the
// sharing mode asked for (or, when exclusive is asked for, MPS if the GPU's
// daemon left a state, else time-slicing); a GPU nobody holds takes the mode
// asked for. So a restart never takes a GPU from its pods.
type sharingModes struct {
	// stateDir is where the MPS daemons' states are read: the host's
	// --mps-dir below the host root.
	stateDir string
	now      func() time.Time
	// settle is how long a GPU asked for another mode is published with
	// requestedMode before it switches, even when no pod holds it: the
	// scheduler stops placing pods on it when it reads requestedMode, and a
	// pod it bound just before, for the mode the GPU leaves, reaches the
	// agent's pod informer within that time. Switching at once would leave
	// such a pod with slots (or a whole GPU) the kubelet no longer has:
	// refused at admission.
	settle time.Duration
	// asked is, per GPU, the mode last asked for that differs from the one
	// in force, and since when.
	asked map[string]askedMode

	current map[string]v1alpha1.SharingMode // GPU id -> the mode in force
	waiting map[string]v1alpha1.SharingMode // GPU id -> the mode whose wait was recorded
	labels  map[string]string               // the Node's last labels read
}

func newSharingModes(hostRoot, mpsDir string) *sharingModes {
	if mpsDir == "" {
		mpsDir = mpsstate.DefaultDir
	}
	return &sharingModes{
		stateDir: filepath.Join(hostRoot, mpsDir),
		now:      time.Now,
		settle:   defaultModeSettle,
		asked:    map[string]askedMode{},
		current:  map[string]v1alpha1.SharingMode{},
		waiting:  map[string]v1alpha1.SharingMode{},
	}
}

// defaultModeSettle is sharingModes.settle: the scheduler reads a
// NodeDevices change within milliseconds, and the agent's pod informer a
// binding as fast; seconds cover an apiserver under load.
const defaultModeSettle = 2 * time.Second

// askedMode is a mode asked for a GPU, and when it was first seen asked.
type askedMode struct {
	mode  v1alpha1.SharingMode
	since time.Time
}

// sharingInput is what one pass of sharingModes reads besides the devices.
type sharingInput struct {
	// node is the agent's Node, nil when it could not be read (the last
	// labels read are then used).
	node *corev1.Node
	// holders lists what holds a device: the pods assigned it
	// (handoff.Allocator.Holders), or on a DRA node the claims prepared on it
	// (draplugin.Plugin.Holders), named holderKind; nil when the agent
	// serves neither, and so knows of no holder.
	holders    func(id string) []handoff.Holder
	holderKind string
	// published is the mode the agent published for a device before, read
	// only for a GPU it has no mode of yet.
	published func(id string) (v1alpha1.SharingMode, bool)
	// event records an Event on the Node.
	event func(eventtype, reason, message string)
}

// apply sets Sharing on every GPU of devices, and marks a GPU in MPS mode
// whose daemon does not run unhealthy. again, when positive, is when a pass
// must run again for a GPU waiting only for settle to switch.
func (s *sharingModes) apply(logger klog.Logger, devices []v1alpha1.Device, in sharingInput) (again time.Duration) {
	if in.node != nil {
		s.labels = in.node.Labels
	}
	for i := range devices {
		d := &devices[i]
		if d.Kind != v1alpha1.DeviceKindNvidiaGPU {
			continue
		}
		wanted, why := wantedSharingMode(s.labels, d.ID)
		if b := d.Attributes[v1alpha1.AttributeMIGEnabled].BoolValue; b != nil && *b {
			// Served through its MIG devices, which are not shared.
			if wanted.Shares() {
				d.Sharing = &v1alpha1.DeviceSharing{Mode: v1alpha1.SharingExclusive, Message: "the GPU is in MIG mode: its MIG devices are served whole, never shared"}
			}
			continue
		}
		var holders []handoff.Holder
		if in.holders != nil {
			holders = in.holders(d.ID)
		}
		current, known := s.current[d.ID]
		if !known {
			current, known = s.restore(d.ID, wanted, holders, in.published)
		}
		sharing := &v1alpha1.DeviceSharing{}
		var msgs []string
		if why != "" {
			msgs = append(msgs, why)
		}
		settling := s.settleLeft(d.ID, current, wanted, known)
		switch {
		case current == wanted:
			delete(s.waiting, d.ID)
		case len(holders) == 0 && settling > 0:
			sharing.RequestedMode = wanted
			msgs = append(msgs, fmt.Sprintf("sharing mode %s in %s, once no pod can have been placed on the GPU for mode %s", wanted, settling.Round(100*time.Millisecond), current))
			if again <= 0 || settling < again {
				again = settling
			}
		case len(holders) == 0:
			if known {
				logger.Info("sharing mode changed", "device", d.ID, "mode", wanted, "was", current)
				in.event(corev1.EventTypeNormal, reasonSharingChanged, fmt.Sprintf("GPU %s: sharing mode %s (was %s)", d.ID, wanted, current))
			}
			current = wanted
			delete(s.waiting, d.ID)
		default:
			sharing.RequestedMode = wanted
			msg := fmt.Sprintf("sharing mode %s waits for the %s that hold the GPU in mode %s to end: %s", wanted, in.holderKind, current, nameHolders(holders))
			msgs = append(msgs, msg)
			if s.waiting[d.ID] != wanted {
				s.waiting[d.ID] = wanted
				logger.Info("sharing mode change waits for holders", "device", d.ID, "mode", wanted, "current", current, in.holderKind, len(holders))
				in.event(corev1.EventTypeNormal, reasonSharingWaiting, fmt.Sprintf("GPU %s: %s", d.ID, msg))
			}
		}
		s.current[d.ID] = current
		sharing.Mode = current
		if current.Shares() {
			sharing.Capacity, sharing.Enforcement = shareCapacity(d, current)
		}
		if current == v1alpha1.SharingMPS {
			if ok, why := s.daemonServing(d.ID); !ok {
				msgs = append(msgs, why+": the GPU takes no new share")
				if d.Healthy {
					d.Healthy, d.Reason = false, reasonMPSNotRunning
				}
			}
		}
		sharing.Message = boundMessage(strings.Join(msgs, "; "))
		d.Sharing = sharing
	}
	return again
}

// settleLeft is how much longer GPU id must be published asking for wanted
// before it may switch from current (settle); 0 when it may, or when the
// mode in force is not known yet (nothing was published to settle).
func (s *sharingModes) settleLeft(id string, current, wanted v1alpha1.SharingMode, known bool) time.Duration {
	if current == wanted || !known {
		delete(s.asked, id)
		return 0
	}
	a, ok := s.asked[id]
	if !ok || a.mode != wanted {
		a = askedMode{mode: wanted, since: s.now()}
		s.asked[id] = a
	}
	return max(0, s.settle-s.now().Sub(a.since))
}

// wantedSharingMode is the mode the labels ask for a GPU: its own label,
// else the node's, else exclusive; why says so when a value names no mode.
func wantedSharingMode(labels map[string]string, id string) (mode v1alpha1.SharingMode, why string) {
	key, v, ok := deviceLabel(labels, v1alpha1.LabelGPUSharing, v1alpha1.LabelGPUSharingDevicePrefix, id)
	if !ok {
		return v1alpha1.SharingExclusive, ""
	}
	mode, ok = v1alpha1.SharingModeOfLabel(v)
	if !ok {
		why = fmt.Sprintf("label %s=%q names no sharing mode (%s, %s or %s): the GPU is exclusive", key, v,
			v1alpha1.SharingLabelExclusive, v1alpha1.SharingLabelTimeSlicing, v1alpha1.SharingLabelMPS)
	}
	return mode, why
}

// deviceLabel is device id's label of a per-device setting: the device's
// own (devicePrefix followed by id) if the Node has it, else the node's
// (nodeKey); ok is false when neither is set. key says which was read.
func deviceLabel(labels map[string]string, nodeKey, devicePrefix, id string) (key, value string, ok bool) {
	key = devicePrefix + id
	if value, ok = labels[key]; ok {
		return key, value, true
	}
	value, ok = labels[nodeKey]
	return nodeKey, value, ok
}

// restore is the mode in force of a GPU the agent has no mode of (it just
// started, or the GPU just appeared); known is false when nothing says it,
// and the mode asked for is taken without a change to report.
func (s *sharingModes) restore(id string, wanted v1alpha1.SharingMode, holders []handoff.Holder, published func(string) (v1alpha1.SharingMode, bool)) (mode v1alpha1.SharingMode, known bool) {
	if published != nil {
		if m, ok := published(id); ok {
			return m, true
		}
	}
	if len(holders) == 0 {
		return wanted, false
	}
	for _, h := range holders {
		if !h.Share {
			return v1alpha1.SharingExclusive, true
		}
	}
	if wanted.Shares() {
		return wanted, true
	}
	if p, err := mpsstate.Path(s.stateDir, id); err == nil && fileExists(p) {
		return v1alpha1.SharingMPS, true
	}
	return v1alpha1.SharingTimeSlicing, true
}

// shareCapacity is what shares of d may take in mode, and what enforces it
// (docs/sharing.md, "Enforcement, strongest first").
func shareCapacity(d *v1alpha1.Device, mode v1alpha1.SharingMode) (map[string]resource.Quantity, []v1alpha1.SharingEnforcement) {
	capacity := map[string]resource.Quantity{v1alpha1.CapacityCompute: *resource.NewQuantity(100, resource.DecimalSI)}
	// A GPU without its memory published takes no memory share: the selector
	// reads a missing capacity as none.
	if m := d.Attributes[v1alpha1.AttributeMemory].QuantityValue; m != nil {
		capacity[v1alpha1.CapacityMemory] = m.DeepCopy()
	}
	if mode == v1alpha1.SharingMPS {
		return capacity, []v1alpha1.SharingEnforcement{
			{Capacity: v1alpha1.CapacityMemory, Mechanism: v1alpha1.MechanismMPSClientLimit, Strength: v1alpha1.EnforcementSoft},
			{Capacity: v1alpha1.CapacityCompute, Mechanism: v1alpha1.MechanismMPSClientLimit, Strength: v1alpha1.EnforcementSoft},
		}
	}
	return capacity, []v1alpha1.SharingEnforcement{
		{Capacity: v1alpha1.CapacityMemory, Mechanism: v1alpha1.MechanismSchedulerAccounting, Strength: v1alpha1.EnforcementAccounting},
		{Capacity: v1alpha1.CapacityCompute, Mechanism: v1alpha1.MechanismTimeSlicing, Strength: v1alpha1.EnforcementAccounting},
	}
}

// daemonServing reads the MPS daemon's state of a GPU: whether it takes new
// clients, and if not, why.
func (s *sharingModes) daemonServing(id string) (bool, string) {
	st, err := mpsstate.Read(s.stateDir, id)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, "the MPS control daemon has written no state (is the resclass-mps-control DaemonSet running on this node?)"
	case err != nil:
		return false, "the MPS control daemon's state is unreadable: " + err.Error()
	}
	return st.Serving(s.now())
}

// nameHolders names the first pods and counts the others.
func nameHolders(holders []handoff.Holder) string {
	var b strings.Builder
	for i, h := range holders {
		if i == maxHoldersNamed {
			fmt.Fprintf(&b, " and %d more", len(holders)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(h.Namespace + "/" + h.Name)
	}
	return b.String()
}

func boundMessage(s string) string {
	if len(s) <= maxSharingMessage {
		return s
	}
	cut := maxSharingMessage - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
