package resourceclasses

import (
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	sigsjson "sigs.k8s.io/json"
)

// Strategy decides which free devices a pod gets on a node, and how the plugin
// scores nodes.
type Strategy string

// The strategies.
const (
	// FirstFit takes the devices in the order the node publishes them (the seed's
	// behaviour) and does not score nodes: other plugins choose the node.
	FirstFit Strategy = "FirstFit"
	// BinPack prefers nodes whose devices of the requested classes are already
	// most used, and on a node the NUMA node with the fewest free devices, so
	// that whole nodes and NUMA nodes stay free for large pods.
	BinPack Strategy = "BinPack"
	// Spread prefers the least used nodes and NUMA nodes.
	Spread Strategy = "Spread"
	// NUMAAligned prefers devices on one NUMA node across all of a pod's classes
	// (GPU and NIC on the same socket for GPUDirect, hugepages beside them), the
	// fullest NUMA node that fits; nodes where the pod fits on one NUMA node score
	// highest.
	NUMAAligned Strategy = "NUMAAligned"
	// Topology gives each class of a pod the set of free devices with the
	// best interconnect: NVLinks between the chosen pairs first, then one PCIe
	// switch, one PCIe root complex, one NUMA node, counted across all of the
	// pod's devices (a GPU and a NIC under one switch), ties broken toward
	// leaving well-connected sets free; nodes score by the best set they
	// offer (docs/scheduler.md, "Topology").
	Topology Strategy = "Topology"
)

var strategies = []Strategy{FirstFit, BinPack, Spread, NUMAAligned, Topology}

// shareStrategies are the strategies a share class's shares are placed with
// on a node (Args.ShareStrategy): the GPU with the least room that takes the
// share (BinPack), or the most (Spread).
var shareStrategies = []Strategy{BinPack, Spread}

// AssignmentWrite is how the assignment annotations reach the pod.
type AssignmentWrite string

const (
	// WriteInBinding puts the annotations on the Binding: the apiserver sets
	// the node and the annotations in one write, so no pod is ever bound
	// without its assignment and binding costs no extra API call.
	WriteInBinding AssignmentWrite = "Binding"
	// WriteInPreBind patches the pod before it is bound, then the next Bind
	// plugin binds it: one more write per pod, for setups where another Bind
	// plugin must bind. The patch is written at the bind extension point, not
	// in PreBind: a PreBind with work makes kube-scheduler patch the pod's
	// nominatedNodeName first, a second extra write (docs/scheduler.md).
	WriteInPreBind AssignmentWrite = "PreBind"
)

// Args configure the ResourceClasses plugin, in the KubeSchedulerConfiguration:
//
//	pluginConfig:
//	- name: ResourceClasses
//	  args:
//	    strategy: NUMAAligned
//	    shareStrategy: BinPack
//	    assignmentWrite: Binding
//	    statusUpdateInterval: 2s
type Args struct {
	// Strategy is one of FirstFit (default), BinPack, Spread, NUMAAligned,
	// Topology.
	Strategy Strategy `json:"strategy,omitempty"`
	// ShareStrategy is how a share class's shares take a node's GPUs
	// (docs/sharing.md): BinPack (default) puts a share on the GPU with the
	// least room that takes it, so that whole GPUs stay free for pods that
	// need a whole one and for mode changes; Spread on the one with the most,
	// for isolation. Strategy still scores nodes and places whole devices.
	ShareStrategy Strategy `json:"shareStrategy,omitempty"`
	// AssignmentWrite is Binding (default) or PreBind.
	AssignmentWrite AssignmentWrite `json:"assignmentWrite,omitempty"`
	// StatusUpdateInterval is the debounce of ResourceClass status writes: changes
	// within it are written together. Default 1s; 0 turns status writing off.
	StatusUpdateInterval *metav1.Duration `json:"statusUpdateInterval,omitempty"`
	// StatusLeaseNamespace and StatusLeaseName name the Lease through which one
	// replica, the leader, writes ResourceClass status. Default: the namespace in
	// POD_NAMESPACE (else kube-system) and "resclass-class-status".
	StatusLeaseNamespace string `json:"statusLeaseNamespace,omitempty"`
	StatusLeaseName      string `json:"statusLeaseName,omitempty"`
}

const (
	defaultStatusUpdateInterval = time.Second
	defaultStatusLeaseName      = "resclass-class-status"
)

// DecodeArgs reads the plugin's args strictly (an unknown field is an error, a
// misspelt option is never ignored), fills in defaults and validates them.
func DecodeArgs(obj runtime.Object, podNamespace string) (*Args, error) {
	args := &Args{}
	if obj != nil {
		var raw []byte
		switch o := obj.(type) {
		case *runtime.Unknown:
			raw = o.Raw
		default:
			return nil, fmt.Errorf("ResourceClasses args: want an object, got %T", obj)
		}
		if len(raw) > 0 {
			strict, err := sigsjson.UnmarshalStrict(raw, args)
			if err != nil {
				return nil, fmt.Errorf("ResourceClasses args: %w", err)
			}
			if len(strict) > 0 {
				return nil, fmt.Errorf("ResourceClasses args: %w", strict[0])
			}
		}
	}
	if args.Strategy == "" {
		args.Strategy = FirstFit
	}
	if args.ShareStrategy == "" {
		args.ShareStrategy = BinPack
	}
	if args.AssignmentWrite == "" {
		args.AssignmentWrite = WriteInBinding
	}
	if args.StatusUpdateInterval == nil {
		args.StatusUpdateInterval = &metav1.Duration{Duration: defaultStatusUpdateInterval}
	}
	if args.StatusLeaseNamespace == "" {
		args.StatusLeaseNamespace = podNamespace
		if args.StatusLeaseNamespace == "" {
			args.StatusLeaseNamespace = metav1.NamespaceSystem
		}
	}
	if args.StatusLeaseName == "" {
		args.StatusLeaseName = defaultStatusLeaseName
	}
	if errs := ValidateArgs(args, field.NewPath("args")); len(errs) > 0 {
		return nil, fmt.Errorf("ResourceClasses args: %w", errs.ToAggregate())
	}
	return args, nil
}

// ValidateArgs checks defaulted args.
func ValidateArgs(a *Args, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	valid := false
	names := make([]string, len(strategies))
	for i, s := range strategies {
		names[i] = string(s)
		valid = valid || a.Strategy == s
	}
	if !valid {
		errs = append(errs, field.NotSupported(p.Child("strategy"), a.Strategy, names))
	}
	if !slices.Contains(shareStrategies, a.ShareStrategy) {
		errs = append(errs, field.NotSupported(p.Child("shareStrategy"), a.ShareStrategy, shareStrategies))
	}
	if a.AssignmentWrite != WriteInBinding && a.AssignmentWrite != WriteInPreBind {
		errs = append(errs, field.NotSupported(p.Child("assignmentWrite"), a.AssignmentWrite, []string{string(WriteInBinding), string(WriteInPreBind)}))
	}
	if a.StatusUpdateInterval != nil && a.StatusUpdateInterval.Duration < 0 {
		errs = append(errs, field.Invalid(p.Child("statusUpdateInterval"), a.StatusUpdateInterval.Duration.String(), "must not be negative (0 turns status writing off)"))
	}
	for _, f := range []struct{ name, value string }{{"statusLeaseNamespace", a.StatusLeaseNamespace}, {"statusLeaseName", a.StatusLeaseName}} {
		check := validation.IsDNS1123Subdomain
		if f.name == "statusLeaseNamespace" {
			check = validation.IsDNS1123Label
		}
		if msgs := check(f.value); len(msgs) > 0 {
			errs = append(errs, field.Invalid(p.Child(f.name), f.value, strings.Join(msgs, "; ")))
		}
	}
	return errs
}
