// Package kinds lists the device kinds resclass ships: adding a kind is one
// new package under pkg/devicekind and one line here (docs/architecture.md,
// "Adding a kind").
package kinds

import (
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/hugepages"
	"github.com/resclass/resclass/pkg/devicekind/nic"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
)

// Builtin are the kinds every binary knows, in the order a container's edits
// are merged.
var Builtin = devicekind.NewRegistry(
	nvidiagpu.Kind{},
	nic.Kind{},
	hugepages.Kind{},
)
