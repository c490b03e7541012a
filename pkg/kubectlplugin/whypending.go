package kubectlplugin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// Pending is why-pending's answer.
type Pending struct {
	Pod       string `json:"pod"`
	Scheduler string `json:"scheduler"`
	// Node is where the pod is bound; empty while it is Pending.
	Node string `json:"node,omitempty"`
	// Requests are the devices per class the pod takes fresh.
	Requests map[string]int `json:"requests,omitempty"`
	// Refused is the scheduler plugin's refusal of the pod itself, before any
	// node (a class that does not exist, requests it cannot read).
	Refused string        `json:"refused,omitempty"`
	Nodes   []PendingNode `json:"nodes,omitempty"`
	// NodesUnread: Nodes could not be read (no right to), so every node that
	// publishes devices is shown, whatever the pod's node selector says, and
	// whether its agent serves the classes is not judged.
	NodesUnread bool     `json:"nodesUnread,omitempty"`
	Events      []Event  `json:"events,omitempty"`
	Notes       []string `json:"notes,omitempty"`
}

// PendingNode is the plugin's answer for the pod on one node.
type PendingNode struct {
	Node string `json:"node"`
	Fits bool   `json:"fits"`
	// Reason is the plugin's, as in the scheduler's FailedScheduling Event.
	Reason       string `json:"reason,omitempty"`
	Unresolvable bool   `json:"unresolvable,omitempty"`
	// Free is, per requested class, the devices a new pod of it can get on
	// the node and how many it may give out: "gpu=0/8".
	Free string `json:"free"`
	// Excluded: the pod's node selector or required node affinity rules the
	// node out, whatever its devices.
	Excluded bool `json:"excluded,omitempty"`
}

// Event is one Event recorded on the pod or its owner.
type Event struct {
	Object  string    `json:"object"`
	Type    string    `json:"type"`
	Reason  string    `json:"reason"`
	Count   int32     `json:"count,omitempty"`
	Last    time.Time `json:"last"`
	Message string    `json:"message"`
}

func (o *options) whyPendingCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "why-pending POD",
		Short: "The pod's class requests against every node, in the scheduler's words, with the pod's Events",
		Long: `why-pending runs the resclass scheduler plugin's own PreFilter and Filter for the
pod against every node that publishes devices, over the devices pods hold now,
and prints each node's answer as the scheduler's FailedScheduling Event words
it, with the free devices of the pod's classes there. Nodes the pod's
nodeSelector or required node affinity rule out are marked (when Nodes may be
read). Then it lists the Events recorded on the pod and, for a pod with a
controller, the Warning Events on the controller: admission and quota
refusals of its sibling pods are recorded there.

Only the class requests are decided here; the FailedScheduling Event says
what the scheduler's other plugins (CPU, memory, taints, affinity) decided.`,
		Example: `  kubectl resclass why-pending train-0 -n team-a`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.checkOutput(); err != nil {
				return err
			}
			ns, _, err := o.config.ToRawKubeConfigLoader().Namespace()
			if err != nil {
				return err
			}
			c, err := o.clients()
			if err != nil {
				return err
			}
			p, err := whyPending(cmd.Context(), c, ns, args[0])
			if err != nil {
				return err
			}
			return o.print(p, p.table)
		},
	}
	return cmd
}

func whyPending(ctx context.Context, c *clients, ns, name string) (*Pending, error) {
	pod, err := c.kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	p := &Pending{Pod: ns + "/" + name, Scheduler: pod.Spec.SchedulerName, Node: pod.Spec.NodeName}
	if p.Node == "" {
		w, err := c.load(ctx)
		if err != nil {
			return nil, err
		}
		if err := p.decide(ctx, c, w, pod); err != nil {
			return nil, err
		}
	} else {
		p.Notes = append(p.Notes, "the pod is bound to node "+p.Node+": it is not waiting for the scheduler")
	}
	p.Events, err = events(ctx, c, pod)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// decide runs the plugin's decisions for the pod on every node.
func (p *Pending) decide(ctx context.Context, c *clients, w *world, pod *corev1.Pod) error {
	snap := w.snapshot()
	// Which nodes the pod's node selector and required node affinity allow:
	// the scheduler's own matcher (component-helpers), and whether each
	// node's agent serves the pod's classes, as Filter judges it from the
	// kubelet's allocatable: when Nodes may be read.
	allowed := map[string]bool{}
	nodes, err := c.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	switch {
	case err == nil:
		snap.WithNodes(nodes.Items)
		req := nodeaffinity.GetRequiredNodeAffinity(pod)
		for i := range nodes.Items {
			if ok, _ := req.Match(&nodes.Items[i]); ok {
				allowed[nodes.Items[i].Name] = true
			}
		}
	case apierrors.IsForbidden(err):
		p.NodesUnread = true
	default:
		return fmt.Errorf("listing nodes: %w", err)
	}
	draws, fits, err := snap.Fit(pod)
	p.Requests = draws
	if err != nil {
		p.Refused = err.Error()
		return nil
	}
	if draws == nil {
		p.Notes = append(p.Notes, "the pod requests no class.resclass.io/<class> resource: the resclass plugin has nothing to decide")
		return nil
	}
	status := snap.NodeStatus()
	for _, f := range fits {
		pn := PendingNode{Node: f.Node, Fits: f.Fits, Reason: f.Reason, Unresolvable: f.Unresolvable, Excluded: !p.NodesUnread && !allowed[f.Node]}
		var free []string
		for _, class := range slices.Sorted(maps.Keys(draws)) {
			var alloc, req int64
			for _, n := range status[class] {
				if n.Name == f.Node {
					alloc, req = n.Allocatable, n.Requested
				}
			}
			free = append(free, fmt.Sprintf("%s=%d/%d", class, alloc-req, alloc))
		}
		pn.Free = strings.Join(free, ",")
		p.Nodes = append(p.Nodes, pn)
	}
	if p.Scheduler != "resclass-scheduler" {
		p.Notes = append(p.Notes, fmt.Sprintf("the pod names scheduler %q: the answers are the resclass plugin's, which only a scheduler running it gives", p.Scheduler))
	}
	return nil
}

// events lists the Events on the pod and the Warning Events on its
// controller, oldest first.
func events(ctx context.Context, c *clients, pod *corev1.Pod) ([]Event, error) {
	var out []Event
	add := func(kind, name string, uid string, warningsOnly bool) error {
		l, err := c.kube.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": name, "involvedObject.kind": kind}.String(),
		})
		if apierrors.IsForbidden(err) {
			return nil // view may be narrower somewhere; the decisions above stand
		}
		if err != nil {
			return fmt.Errorf("listing the Events of %s %s: %w", kind, name, err)
		}
		for _, e := range l.Items {
			if string(e.InvolvedObject.UID) != uid && e.InvolvedObject.UID != "" {
				continue // a former object of the same name
			}
			if warningsOnly && e.Type != corev1.EventTypeWarning {
				continue
			}
			last := e.LastTimestamp.Time
			if last.IsZero() {
				last = e.EventTime.Time
			}
			out = append(out, Event{Object: kind + "/" + name, Type: e.Type, Reason: e.Reason, Count: e.Count, Last: last, Message: e.Message})
		}
		return nil
	}
	if err := add("Pod", pod.Name, string(pod.UID), false); err != nil {
		return nil, err
	}
	if owner := metav1.GetControllerOf(pod); owner != nil {
		if err := add(owner.Kind, owner.Name, string(owner.UID), true); err != nil {
			return nil, err
		}
	}
	slices.SortStableFunc(out, func(a, b Event) int { return a.Last.Compare(b.Last) })
	return out, nil
}

func (p *Pending) table(t *table) {
	t.row("Pod:\t%s", p.Pod)
	t.row("Scheduler:\t%s", p.Scheduler)
	if p.Node != "" {
		t.row("Node:\t%s", p.Node)
	}
	if len(p.Requests) > 0 {
		var r []string
		for _, class := range slices.Sorted(maps.Keys(p.Requests)) {
			r = append(r, fmt.Sprintf("%s=%d", class, p.Requests[class]))
		}
		t.row("Requests:\t%s", strings.Join(r, ", "))
	}
	if p.Refused != "" {
		t.row("Refused:\t%s (on every node)", p.Refused)
	}
	for _, n := range p.Notes {
		t.row("Note:\t%s", n)
	}
	if p.NodesUnread {
		t.row("Note:\tNodes cannot be read, so the pod's node selector is not applied below, nor is whether each node's agent serves the classes (the kubelet's allocatable)")
	}
	if len(p.Nodes) > 0 {
		t.row("")
		t.row("NODE\tFITS\tFREE\tREASON")
		for _, n := range p.Nodes {
			fits := "no"
			if n.Fits {
				fits = "yes"
			}
			reason := n.Reason
			if n.Excluded {
				fits, reason = "-", "not a candidate: the pod's nodeSelector or required node affinity rules it out"
				if n.Reason != "" {
					reason += "; and: " + n.Reason
				}
			}
			t.row("%s\t%s\t%s\t%s", n.Node, fits, n.Free, reason)
		}
	}
	t.row("")
	if len(p.Events) == 0 {
		t.row("Events:\t<none>")
		return
	}
	t.row("LAST SEEN\tTYPE\tREASON\tOBJECT\tMESSAGE")
	for _, e := range p.Events {
		t.row("%s\t%s\t%s\t%s\t%s", e.Last.UTC().Format(time.RFC3339), e.Type, e.Reason, e.Object, e.Message)
	}
}
