//go:build !cgo

package nvidiagpu

import (
	"errors"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/devicekind"
)

// NVML is empty without cgo: a binary built so (the scheduler, the webhook)
// asks the kind everything but discovery.
type NVML struct{}

// errNoCgo is why NVML does not open in a binary built without cgo.
var errNoCgo = errors.New("NVML is not available: built without cgo")

// SourceName names NVML in metrics and logs.
func (Kind) SourceName() string { return "nvml" }

// Open fails: NVML is loaded through cgo.
func (Kind) Open(devicekind.DiscoverOptions) (devicekind.Source, error) { return nil, errNoCgo }

// NotOpen says why NVML is not open.
func (Kind) NotOpen(err error) metav1.Condition {
	return metav1.Condition{Type: Condition, Status: metav1.ConditionFalse, Reason: "Unavailable", Message: err.Error()}
}
