package kubectlplugin

import (
	"maps"
	"slices"

	"github.com/spf13/cobra"

	"github.com/resclass/resclass/pkg/scheduler/resourceclasses"
)

// ClassCapacity is one class's devices, cluster-wide and per node, as the
// scheduler writes them into the class's status: allocatable (healthy
// devices it selects that may be given out), held (of those, the ones a new
// pod of the class cannot get) and free (what it can). A device counts in
// every class that selects it. A share class (docs/sharing.md) counts units
// of Unit instead of devices.
type ClassCapacity struct {
	Class       string `json:"class"`
	Allocatable int64  `json:"allocatable"`
	Held        int64  `json:"held"`
	Free        int64  `json:"free"`
	// Unit is what one unit of a share class takes of a GPU; empty for a
	// class of whole devices.
	Unit  string         `json:"unit,omitempty"`
	Nodes []NodeCapacity `json:"nodes,omitempty"`
}

// NodeCapacity is a class's devices on one node.
type NodeCapacity struct {
	Node        string `json:"node"`
	Allocatable int64  `json:"allocatable"`
	Held        int64  `json:"held"`
	Free        int64  `json:"free"`
	// GPUIsolation is set when the node's GPUs are not proven isolated: a
	// pod there may reach GPUs beyond these counts.
	GPUIsolation *IsolationNote `json:"gpuIsolation,omitempty"`
}

func (o *options) capacityCommand() *cobra.Command {
	var perNode bool
	cmd := &cobra.Command{
		Use:   "capacity [--nodes]",
		Short: "Every class: devices allocatable, held and free, cluster-wide or per node",
		Long: `capacity counts, per class, the healthy devices it selects that may be given out
(ALLOCATABLE), those a new pod of the class cannot get because pods hold them,
through any class (HELD), and the rest (FREE): the figures the scheduler writes
into each ResourceClass's status, computed now from the same cache. A device
selected by two classes counts in both. A share class counts units (UNIT says
what one takes of a GPU): those that fit its GPUs' sharing capacity, those
that no longer fit what the GPUs have free, and those that do.

A line follows the table for each node whose GPUs are not proven isolated
(the NodeDevices condition GPUIsolation): there the NVIDIA container runtime
accepts NVIDIA_VISIBLE_DEVICES from unprivileged containers, or the node
agent could not check it, and a pod may reach GPUs beyond these counts.`,
		Example: `  kubectl resclass capacity
  kubectl resclass capacity --nodes -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.checkOutput(); err != nil {
				return err
			}
			w, err := o.world(cmd.Context())
			if err != nil {
				return err
			}
			notes := isolationNotes(w.nodes)
			caps := capacity(w, notes, perNode)
			return o.print(caps, func(t *table) {
				if perNode {
					t.row("CLASS\tNODE\tALLOCATABLE\tHELD\tFREE\tUNIT")
				} else {
					t.row("CLASS\tALLOCATABLE\tHELD\tFREE\tUNIT")
				}
				for _, c := range caps {
					unit := c.Unit
					if unit == "" {
						unit = "device"
					}
					if !perNode {
						t.row("%s\t%d\t%d\t%d\t%s", c.Class, c.Allocatable, c.Held, c.Free, unit)
						continue
					}
					t.row("%s\t%s\t%d\t%d\t%d\t%s", c.Class, "(all)", c.Allocatable, c.Held, c.Free, unit)
					for _, n := range c.Nodes {
						t.row("%s\t%s\t%d\t%d\t%d\t%s", c.Class, n.Node, n.Allocatable, n.Held, n.Free, unit)
					}
				}
				isolationRows(t, notes)
			})
		},
	}
	cmd.Flags().BoolVar(&perNode, "nodes", false, "Also per node.")
	return cmd
}

func capacity(w *world, notes map[string]IsolationNote, perNode bool) []ClassCapacity {
	snap := w.snapshot()
	status := snap.Status()
	var nodes map[string][]resourceclasses.NodeStatus
	if perNode {
		nodes = snap.NodeStatus()
	}
	out := []ClassCapacity{}
	for _, class := range slices.Sorted(maps.Keys(status)) {
		s := status[class]
		c := ClassCapacity{Class: class, Allocatable: s.Allocatable.Value(), Held: s.Requested.Value(), Free: s.Available.Value()}
		c.Unit, _ = snap.ShareUnit(class)
		if perNode {
			for _, n := range nodes[class] {
				c.Nodes = append(c.Nodes, NodeCapacity{Node: n.Name, Allocatable: n.Allocatable, Held: n.Requested, Free: n.Allocatable - n.Requested, GPUIsolation: note(notes, n.Name)})
			}
		}
		out = append(out, c)
	}
	return out
}
