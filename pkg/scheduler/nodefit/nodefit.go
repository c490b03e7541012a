// Package nodefit is upstream's NodeResourcesFit plugin as the resclass
// scheduler runs it: shown each pod without its class.resclass.io requests.
//
// Those requests are ResourceClasses' to check: it counts them against the
// devices each class selects, overlaps included, where the kubelet's per-class
// allocatable counts a device once per class that selects it. So upstream's
// plugin is told to ignore them (ignoredResourceGroups). But it finds that out
// per node: for every scalar request, on every node it filters, it first
// validates the resource's name with regular expressions, and that check costs
// more the longer the name is. For a pod of one class.resclass.io/<class>
// request on 1000 nodes this was 0.67 ms of the scheduler's CPU per pod
// (docs/scheduler.md, "Where the time goes"). A pod without the requests in
// PreFilter never reaches that check: everything else NodeResourcesFit does
// (CPU, memory, pods, other extended resources, scoring, queueing hints) is
// upstream's own code, unchanged.
package nodefit

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	configv1 "k8s.io/kube-scheduler/config/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// Name is the plugin's name in the KubeSchedulerConfiguration. The profile
// disables NodeResourcesFit and enables this one in its place; its args are
// NodeResourcesFit's (NodeResourcesFitArgs).
const Name = "NodeResourcesFitWithoutClasses"

// Plugin is upstream's NodeResourcesFit, every extension point its own but
// PreFilter, which hands it the pod without its class requests.
type Plugin struct {
	*noderesources.Fit
}

var (
	_ fwk.PreFilterPlugin   = &Plugin{}
	_ fwk.FilterPlugin      = &Plugin{}
	_ fwk.PreScorePlugin    = &Plugin{}
	_ fwk.ScorePlugin       = &Plugin{}
	_ fwk.EnqueueExtensions = &Plugin{}
)

// New is the plugin's factory, for app.WithPlugin(Name, New). obj holds
// NodeResourcesFitArgs as the configuration file spells them (v1), or nothing
// for upstream's defaults.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, err := decodeArgs(obj)
	if err != nil {
		return nil, err
	}
	pl, err := noderesources.NewFit(ctx, args, h, feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	fit, ok := pl.(*noderesources.Fit)
	if !ok {
		return nil, fmt.Errorf("%s: NodeResourcesFit's factory returned %T", Name, pl)
	}
	return &Plugin{Fit: fit}, nil
}

// decodeArgs reads v1 NodeResourcesFitArgs with upstream's defaults, as the
// scheduler does for NodeResourcesFit itself; NewFit validates them.
func decodeArgs(obj runtime.Object) (*config.NodeResourcesFitArgs, error) {
	var v1 configv1.NodeResourcesFitArgs
	if obj != nil {
		if err := frameworkruntime.DecodeInto(obj, &v1); err != nil {
			return nil, fmt.Errorf("%s args: %w", Name, err)
		}
	}
	scheme.Scheme.Default(&v1)
	var args config.NodeResourcesFitArgs
	if err := scheme.Scheme.Convert(&v1, &args, nil); err != nil {
		return nil, fmt.Errorf("%s args: %w", Name, err)
	}
	return &args, nil
}

// Name is the plugin's configured name.
func (p *Plugin) Name() string { return Name }

// PreFilter is NodeResourcesFit's, for the pod without its class requests:
// Filter then never looks at them.
func (p *Plugin) PreFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	return p.Fit.PreFilter(ctx, cs, WithoutClasses(pod), nodes)
}

// WithoutClasses returns pod without its class.resclass.io requests and
// limits: pod itself when it has none, else a copy that shares everything
// but the containers' resource lists.
func WithoutClasses(pod *corev1.Pod) *corev1.Pod {
	if !hasClasses(pod.Spec.InitContainers) && !hasClasses(pod.Spec.Containers) {
		return pod
	}
	out := *pod
	out.Spec.InitContainers = strip(pod.Spec.InitContainers)
	out.Spec.Containers = strip(pod.Spec.Containers)
	return &out
}

func isClass(name corev1.ResourceName) bool {
	return strings.HasPrefix(string(name), v1alpha1.ResourceNamePrefix)
}

func hasClasses(containers []corev1.Container) bool {
	for i := range containers {
		r := &containers[i].Resources
		for name := range r.Requests {
			if isClass(name) {
				return true
			}
		}
		for name := range r.Limits {
			if isClass(name) {
				return true
			}
		}
	}
	return false
}

// strip copies containers, each with its resource lists less the class
// entries.
func strip(containers []corev1.Container) []corev1.Container {
	if containers == nil {
		return nil
	}
	out := make([]corev1.Container, len(containers))
	for i := range containers {
		out[i] = containers[i]
		out[i].Resources.Requests = without(containers[i].Resources.Requests)
		out[i].Resources.Limits = without(containers[i].Resources.Limits)
	}
	return out
}

func without(list corev1.ResourceList) corev1.ResourceList {
	if list == nil {
		return nil
	}
	out := make(corev1.ResourceList, len(list))
	for name, q := range list {
		if !isClass(name) {
			out[name] = q
		}
	}
	return out
}
