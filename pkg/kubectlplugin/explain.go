package kubectlplugin

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/scheduler/resourceclasses"
)

// Explanation is explain's and preview's answer for one class.
type Explanation struct {
	Class string            `json:"class"`
	Nodes []NodeExplanation `json:"nodes"`
}

// NodeExplanation is one node's devices as the class sees them.
type NodeExplanation struct {
	Node string `json:"node"`
	// Selected, Healthy and Free count the devices the class selects, those
	// of them that are healthy, and those a new pod of the class could get.
	Selected int `json:"selected"`
	Healthy  int `json:"healthy"`
	Free     int `json:"free"`
	// Blocked: devices of the class held by pods whose assignment the
	// scheduler does not believe, which ones unknown.
	Blocked int `json:"blocked,omitempty"`
	// Units and FreeUnits, for a share class: the units of the class that
	// fit the sharing capacity of the healthy GPUs it selects that take new
	// pods, and what they have free (the class status's figures on the node).
	Units     int64                            `json:"units,omitempty"`
	FreeUnits int64                            `json:"freeUnits,omitempty"`
	Devices   []resourceclasses.SnapshotDevice `json:"devices"`
	// GPUIsolation is set when the node's GPUs are not proven isolated: a
	// pod there may reach GPUs the scheduler did not assign it.
	GPUIsolation *IsolationNote `json:"gpuIsolation,omitempty"`
}

func (o *options) explainCommand() *cobra.Command {
	var node string
	cmd := &cobra.Command{
		Use:   "explain CLASS [--node NODE]",
		Short: "Per node: the devices a class selects, healthy, free, and why the others are not selected",
		Example: `  kubectl resclass explain nvidia.high.mem
  kubectl resclass explain nvidia.high.mem --node gpu-node-1 -o yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.checkOutput(); err != nil {
				return err
			}
			w, err := o.world(cmd.Context())
			if err != nil {
				return err
			}
			e, err := explain(w.snapshot(), isolationNotes(w.nodes), args[0], node)
			if err != nil {
				return err
			}
			return o.print(e, e.table)
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "Only this node (its NodeDevices object's name, the node's name).")
	return cmd
}

// explain collects class's view of every node (or only node), with the
// isolation notes of those nodes.
func explain(s *resourceclasses.Snapshot, notes map[string]IsolationNote, class, node string) (*Explanation, error) {
	nodes, ok := s.Devices(class)
	if !ok {
		return nil, fmt.Errorf("ResourceClass %q not found", class)
	}
	e := &Explanation{Class: class, Nodes: []NodeExplanation{}}
	for _, n := range nodes {
		if node != "" && n.Node != node {
			continue
		}
		ne := NodeExplanation{Node: n.Node, Blocked: n.Blocked, Devices: n.Devices, GPUIsolation: note(notes, n.Node)}
		for _, d := range n.Devices {
			if d.Selected {
				ne.Selected++
				if d.Healthy {
					ne.Healthy++
				}
				if d.Share != nil && d.Healthy && d.Unusable == "" {
					ne.Units += d.Share.Units
					ne.FreeUnits += d.Share.FreeUnits
				}
			}
			if d.Free {
				ne.Free++
			}
		}
		e.Nodes = append(e.Nodes, ne)
	}
	if node != "" && len(e.Nodes) == 0 {
		return nil, fmt.Errorf("node %q publishes no devices (no NodeDevices object of that name)", node)
	}
	return e, nil
}

func (e *Explanation) table(t *table) {
	t.row("NODE\tSELECTED\tHEALTHY\tFREE\tNOTE")
	for _, n := range e.Nodes {
		var notes []string
		if n.Units > 0 {
			notes = append(notes, fmt.Sprintf("units free %d/%d", n.FreeUnits, n.Units))
		}
		if n.Blocked > 0 {
			notes = append(notes, fmt.Sprintf("%d held by pods whose assignment the scheduler does not believe", n.Blocked))
		}
		note := strings.Join(notes, "; ")
		t.row("%s\t%d\t%d\t%d\t%s", n.Node, n.Selected, n.Healthy, n.Free, note)
	}
	t.row("")
	t.row("NODE\tDEVICE\tKIND\tSTATE\tWHY")
	for _, n := range e.Nodes {
		for _, d := range n.Devices {
			state, why := deviceState(d)
			t.row("%s\t%s\t%s\t%s\t%s", n.Node, d.ID, d.Kind, state, why)
		}
	}
	notes := map[string]IsolationNote{}
	for _, n := range e.Nodes {
		if n.GPUIsolation != nil {
			notes[n.Node] = *n.GPUIsolation
		}
	}
	isolationRows(t, notes)
}

// deviceState is a device's one-word state for class and what explains it.
func deviceState(d resourceclasses.SnapshotDevice) (state, why string) {
	switch {
	case !d.Selected:
		return "not-selected", strings.Join(d.NotSelected, "; ")
	case !d.Healthy:
		return "unhealthy", "the node agent reports it unhealthy"
	case d.Unusable != "":
		return "unusable", d.Unusable
	case d.Share != nil && !d.Free:
		return "full", "no unit of the class fits what it has free: " + shareUse(d.Share) + heldBy(d)
	case d.Share != nil:
		return "free", shareUse(d.Share) + heldBy(d)
	case len(d.HeldBy) > 0 && !d.Free:
		return "held", "by " + strings.Join(d.HeldBy, ", ")
	case !d.Free:
		return "full", "a hugepage pool without free pages"
	}
	return "free", ""
}

// shareUse says what the shares of a shared GPU take of each capacity, used
// of capacity, and the units of the class free of those that fit.
func shareUse(s *resourceclasses.SnapshotShare) string {
	var parts []string
	if s.Capacity.Memory != nil && s.Used.Memory != nil {
		parts = append(parts, fmt.Sprintf("memory %s/%s", resource.NewQuantity(*s.Used.Memory, resource.BinarySI), resource.NewQuantity(*s.Capacity.Memory, resource.BinarySI)))
	}
	if s.Capacity.Compute != nil && s.Used.Compute != nil {
		parts = append(parts, fmt.Sprintf("compute %d/%d%%", *s.Used.Compute, *s.Capacity.Compute))
	}
	out := fmt.Sprintf("%s shares use %s", s.Mode, strings.Join(parts, ", "))
	if s.Units > 0 {
		out += fmt.Sprintf("; units free %d/%d", s.FreeUnits, s.Units)
	}
	// What keeps a pod within its share (docs/sharing.md, "Enforcement"):
	// Soft and Accounting limits hold only for pods that keep to them.
	var enforced []string
	for _, e := range s.Enforcement {
		enforced = append(enforced, fmt.Sprintf("%s %s (%s)", e.Capacity, e.Mechanism, e.Strength))
	}
	if len(enforced) > 0 {
		out += "; enforced by " + strings.Join(enforced, ", ")
	}
	if s.Message != "" {
		out += "; " + s.Message
	}
	return out
}

// heldBy names the pods holding a shared GPU, if any.
func heldBy(d resourceclasses.SnapshotDevice) string {
	if len(d.HeldBy) == 0 {
		return ""
	}
	return "; held by " + strings.Join(d.HeldBy, ", ")
}

func (o *options) previewCommand() *cobra.Command {
	var file string
	var node string
	cmd := &cobra.Command{
		Use:   "preview -f class.yaml [--node NODE]",
		Short: "What a ResourceClass not yet created would select, per node, and why not the other devices",
		Long: `preview reads one ResourceClass from a file ("-" for standard input), checks its
selectors as the webhook does, and answers as explain would once it exists. A
class of the same name that exists is replaced in the answer, not in the
cluster: preview writes nothing.`,
		Example: `  kubectl resclass preview -f big-gpus.yaml
  kubectl resclass preview -f - <<<'{"apiVersion":"resclass.io/v1alpha1","kind":"ResourceClass","metadata":{"name":"a100"},"spec":{"resourceSelector":[{"matchExpressions":[{"key":"model","operator":"In","values":["A100-SXM4-40GB"]}]}]}}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.checkOutput(); err != nil {
				return err
			}
			rc, err := readClassFile(file, o.streams.In)
			if err != nil {
				return err
			}
			w, err := o.world(cmd.Context())
			if err != nil {
				return err
			}
			w.classes = withClass(w.classes, rc)
			e, err := explain(w.snapshot(), isolationNotes(w.nodes), rc.Name, node)
			if err != nil {
				return err
			}
			return o.print(e, e.table)
		},
	}
	cmd.Flags().StringVarP(&file, "filename", "f", "", "The ResourceClass, as YAML or JSON; - reads standard input.")
	cmd.Flags().StringVar(&node, "node", "", "Only this node.")
	_ = cmd.MarkFlagRequired("filename")
	return cmd
}

// withClass is classes with rc in place of a class of the same name.
func withClass(classes []v1alpha1.ResourceClass, rc *v1alpha1.ResourceClass) []v1alpha1.ResourceClass {
	out := make([]v1alpha1.ResourceClass, 0, len(classes)+1)
	for _, c := range classes {
		if c.Name != rc.Name {
			out = append(out, c)
		}
	}
	return append(out, *rc)
}
