package nodeagent

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// applyMIGModes sets, on every GPU of devices, the MIG mode the Node's
// labels ask for (docs/mig.md, "Which GPUs"): Dynamic lets the scheduler
// place slices to create on it. A GPU in MIG mode is Static unless marked
// dynamic; a value that names no mode is Static with a message; a GPU
// marked dynamic whose MIG mode is off is published with a message and no
// geometry, as the agent never turns MIG mode on (that needs a GPU reset,
// which stops every process on the GPU).
func applyMIGModes(labels map[string]string, devices []v1alpha1.Device) {
	for i := range devices {
		d := &devices[i]
		if d.Kind != v1alpha1.DeviceKindNvidiaGPU {
			continue
		}
		key, v, marked := deviceLabel(labels, v1alpha1.LabelGPUMIG, v1alpha1.LabelGPUMIGDevicePrefix, d.ID)
		mode, message := v1alpha1.MIGStatic, ""
		switch {
		case !marked || v == v1alpha1.MIGLabelStatic:
		case v == v1alpha1.MIGLabelDynamic:
			mode = v1alpha1.MIGDynamic
		default:
			message = fmt.Sprintf("label %s=%.64q names no MIG mode (%s or %s): the GPU is Static", key, v, v1alpha1.MIGLabelDynamic, v1alpha1.MIGLabelStatic)
		}
		on := d.Attributes[v1alpha1.AttributeMIGEnabled].BoolValue
		inMIG := on != nil && *on
		switch {
		case inMIG && d.MIG == nil:
			// Its geometry could not be read (the GPU says why): nothing to
			// place slices on.
			d.MIG = &v1alpha1.DeviceMIG{Mode: v1alpha1.MIGStatic, Message: "the GPU's MIG geometry could not be read"}
		case inMIG:
			d.MIG.Mode, d.MIG.Message = mode, message
		case mode == v1alpha1.MIGDynamic:
			d.MIG = &v1alpha1.DeviceMIG{Mode: v1alpha1.MIGStatic, Message: fmt.Sprintf("label %s asks for dynamic MIG, but the GPU's MIG mode is off: the node agent never turns it on (it needs a GPU reset); turn it on with nvidia-smi -mig 1", key)}
		}
	}
}

// migLabels are the Node's MIG labels, as one comparable string: when they
// change, the agent describes the GPUs again at once, so that a GPU an
// operator just put in MIG mode and marked is seen in MIG mode without
// waiting for the resync.
func migLabels(labels map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if k == v1alpha1.LabelGPUMIG || strings.HasPrefix(k, v1alpha1.LabelGPUMIGDevicePrefix) {
			b.WriteString(k + "=" + labels[k] + "\n")
		}
	}
	return b.String()
}
