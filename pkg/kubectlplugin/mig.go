package kubectlplugin

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/mig"
)

// MIGGPU is one GPU in MIG mode, as its node agent publishes it: the GPU
// instances on it and what could still be created (docs/mig.md).
type MIGGPU struct {
	Node    string `json:"node"`
	GPU     string `json:"gpu"`
	Product string `json:"product,omitempty"`
	// Mode is how resclass partitions the GPU: Dynamic (slices created for
	// pods) or Static (the layout an operator made).
	Mode string `json:"mode"`
	// Message says why the operator's marking is not followed, if it is not.
	Message string `json:"message,omitempty"`
	// Instances are the GPU instances, "<profile>@<first slice>".
	Instances []string `json:"instances"`
	// Created are those of Instances resclass created for pods.
	Created []string `json:"created,omitempty"`
	// FreeSlices are the memory slices (of 8) no instance takes.
	FreeSlices int `json:"freeSlices"`
	// Creatable is, per profile (smallest first), how many instances of it
	// could be created now, one after the other, with nothing else created
	// meanwhile.
	Creatable []MIGCreatable `json:"creatable"`
	// Largest is the largest profile of which one could be created now.
	Largest string `json:"largest,omitempty"`
	// Error says why the published geometry could not be read.
	Error string `json:"error,omitempty"`
}

// MIGCreatable is how many instances of a profile could be created now.
type MIGCreatable struct {
	Profile string `json:"profile"`
	Count   int    `json:"count"`
}

func (o *options) migCommand() *cobra.Command {
	var node string
	cmd := &cobra.Command{
		Use:   "mig [--node NODE]",
		Short: "Every GPU in MIG mode: its GPU instances and what could still be created",
		Long: `mig lists the GPUs in MIG mode that the node agents publish, with the GPU instances on
each (INSTANCES, a profile at the first memory slice it takes; "(created)" for those
resclass created for pods on a GPU marked for dynamic MIG, MODE Dynamic), the memory slices of 8
no instance takes (FREE), the largest profile of which one could still be created
(LARGEST), and per profile how many could be created now, one after the other
(CAN CREATE). A GPU's profiles and placements are NVML's, as the agent read them; two
profiles may not both fit where either alone would, so the counts are not a sum.`,
		Example: `  kubectl resclass mig
  kubectl resclass mig --node gpu-node-3 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.checkOutput(); err != nil {
				return err
			}
			// NodeDevices alone: neither classes nor every pod.
			c, err := o.clients()
			if err != nil {
				return err
			}
			nodes, err := c.nodeDevices(cmd.Context())
			if err != nil {
				return err
			}
			gpus := migGPUs(nodes, node)
			return o.print(gpus, func(t *table) { migTable(t, gpus) })
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "Only this node's GPUs.")
	return cmd
}

// migTable is mig's table of gpus.
func migTable(t *table, gpus []MIGGPU) {
	t.row("NODE\tGPU\tMODE\tINSTANCES\tFREE\tLARGEST\tCAN CREATE")
	for _, g := range gpus {
		switch {
		case g.Error != "":
			t.row("%s\t%s\t%s\t\t\t\t(unreadable: %s)", g.Node, g.GPU, g.Mode, g.Error)
			continue
		case g.Message != "" && len(g.Creatable) == 0:
			t.row("%s\t%s\t%s\t\t\t\t(%s)", g.Node, g.GPU, g.Mode, g.Message)
			continue
		}
		var can []string
		for _, c := range g.Creatable {
			if c.Count > 0 {
				can = append(can, fmt.Sprintf("%s×%d", c.Profile, c.Count))
			}
		}
		marked := make([]string, len(g.Instances))
		for i, in := range g.Instances {
			marked[i] = in
			if slices.Contains(g.Created, in) {
				marked[i] += "(created)"
			}
		}
		instances, largest := strings.Join(marked, ","), g.Largest
		if instances == "" {
			instances = "-"
		}
		if largest == "" {
			largest = "-"
		}
		t.row("%s\t%s\t%s\t%s\t%d/%d\t%s\t%s", g.Node, g.GPU, g.Mode, instances, g.FreeSlices, mig.Slots, largest, strings.Join(can, " "))
	}
}

// migGPUs lists the GPUs in MIG mode of nodes (only node's, if set), by node
// and GPU.
func migGPUs(nodes []v1alpha1.NodeDevices, node string) []MIGGPU {
	out := []MIGGPU{}
	for _, nd := range nodes {
		if node != "" && nd.Name != node {
			continue
		}
		for _, d := range nd.Status.Devices {
			if d.MIG == nil {
				continue
			}
			product := d.Attributes[v1alpha1.AttributeProduct].String()
			g := MIGGPU{Node: nd.Name, GPU: d.ID, Product: product, Mode: string(d.MIG.Mode), Message: d.MIG.Message, Instances: []string{}, Creatable: []MIGCreatable{}}
			if g.Mode == "" {
				g.Mode = string(v1alpha1.MIGStatic)
			}
			for _, in := range d.MIG.Instances {
				if in.Created {
					g.Created = append(g.Created, fmt.Sprintf("%s@%d", in.Profile, in.Start))
				}
			}
			if len(d.MIG.Profiles) == 0 && g.Message != "" {
				out = append(out, g)
				continue
			}
			gpu, err := mig.FromAPI(product, d.MIG)
			if err != nil {
				g.Error = err.Error()
				out = append(out, g)
				continue
			}
			for _, in := range gpu.Instances() {
				g.Instances = append(g.Instances, in.String())
			}
			g.FreeSlices = gpu.FreeSlices()
			for i := range gpu.Table.Profiles {
				p := &gpu.Table.Profiles[i]
				g.Creatable = append(g.Creatable, MIGCreatable{Profile: p.Name, Count: gpu.Creatable(p)})
			}
			if i := gpu.Largest(); i >= 0 {
				g.Largest = gpu.Table.Profiles[i].Name
			}
			out = append(out, g)
		}
	}
	slices.SortFunc(out, func(a, b MIGGPU) int {
		if c := strings.Compare(a.Node, b.Node); c != 0 {
			return c
		}
		return strings.Compare(a.GPU, b.GPU)
	})
	return out
}
