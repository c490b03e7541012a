package handoff

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/checkpoint"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// CheckpointFile is the kubelet device manager's checkpoint, in its plugin
// directory.
const CheckpointFile = "kubelet_internal_checkpoint"

// maxCheckpointBytes bounds what is read of the checkpoint: a node with a
// thousand containers holding eight devices each writes well under 1 MiB.
const maxCheckpointBytes = 16 << 20

// loadCheckpoint marks as allocated every container the kubelet's checkpoint
// lists with devices of a class, and returns how many it found. The kubelet
// writes the file after each allocation, so it is the record of what its
// containers hold, surviving restarts of the agent (and of the kubelet).
func (a *Allocator) loadCheckpoint(path string) (int, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	blob, err := io.ReadAll(io.LimitReader(f, maxCheckpointBytes+1))
	if err != nil {
		return 0, err
	}
	if len(blob) > maxCheckpointBytes {
		return 0, fmt.Errorf("%s is larger than %d MiB: not the kubelet's checkpoint", path, maxCheckpointBytes>>20)
	}
	cp := checkpoint.New(nil, nil)
	if err := cp.UnmarshalCheckpoint(blob); err != nil {
		return 0, fmt.Errorf("parsing %s: %w", path, err)
	}
	if err := cp.VerifyChecksum(); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	entries, _ := cp.GetData()
	a.recordsMu.Lock()
	defer a.recordsMu.Unlock()
	n := 0
	for _, e := range entries {
		class, ok := strings.CutPrefix(e.ResourceName, v1alpha1.ResourceNamePrefix)
		if !ok {
			continue
		}
		var devices []string
		for _, kid := range e.DeviceIDs.Devices().UnsortedList() {
			if id := DeviceID(kid); !slices.Contains(devices, id) {
				devices = append(devices, id)
			}
		}
		r := &Record{PodUID: types.UID(e.PodUID), Container: e.ContainerName, Class: class, Devices: devices, Time: time.Now()}
		if objs, _ := a.informer.GetIndexer().ByIndex(byUID, e.PodUID); len(objs) == 1 {
			p := objs[0].(*podInfo)
			r.Namespace, r.Name = p.Namespace, p.Name
			if p.assignment != nil {
				for _, c := range p.assignment.Containers {
					if c.Name == r.Container {
						r.Share = c.Shares[class]
					}
				}
			}
		} else {
			// The pod is gone: its devices are free.
			continue
		}
		a.allocated[allocKey{pod: r.PodUID, container: r.Container, class: class}] = r
		n++
	}
	return n, nil
}
