package nvml_test

import (
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/discovery/nvml"
)

// The attribute types the kinds declare, for this package's own tests
// (wellKnown in nvml_test.go), which cannot import the kinds.
func init() { nvml.SetWellKnown(kinds.Builtin.Attributes()) }
