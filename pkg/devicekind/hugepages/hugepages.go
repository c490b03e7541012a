// Package hugepages is the device kind of hugepage pools: discovered from
// sysfs (pkg/discovery/hugepages) at every poll, and shared: the scheduler
// counts a pool's free pages, not the pool (docs/hugepages.md).
package hugepages

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
	hpdiscovery "github.com/resclass/resclass/pkg/discovery/hugepages"
)

// The environment a container gets: every class's pools of the container (the
// kubelet merges the classes' responses; the last one wins).
const (
	EnvPool     = "RESCLASS_HUGEPAGES_POOL"
	EnvSize     = "RESCLASS_HUGEPAGES_SIZE"
	EnvNUMANode = "RESCLASS_HUGEPAGES_NUMA_NODE"
)

// LabelSizes lists the hugepage sizes with pages, smallest first, joined by
// "_" ("2Mi_1Gi").
const LabelSizes = devicekind.LabelPrefix + "hugepages.sizes"

// Condition reports whether hugepage discovery works on the node.
const Condition = "HugePagesDiscovered"

// Kind is the huge-pages kind.
type Kind struct{}

var (
	_ devicekind.Kind                 = Kind{}
	_ devicekind.Poller               = Kind{}
	_ devicekind.NodeCapacityReporter = Kind{}
)

// Names: one kind.
func (Kind) Names() []string { return []string{v1alpha1.DeviceKindHugePages} }

// Attributes are what hugepage discovery publishes, and what the scheduler
// reads of a pool.
func (Kind) Attributes() map[string]v1alpha1.AttributeType {
	return map[string]v1alpha1.AttributeType{
		v1alpha1.AttributeSize:         v1alpha1.AttributeTypeQuantity,
		v1alpha1.AttributePagesTotal:   v1alpha1.AttributeTypeInt,
		v1alpha1.AttributePagesFree:    v1alpha1.AttributeTypeInt,
		v1alpha1.AttributeResourceName: v1alpha1.AttributeTypeString,
		v1alpha1.AttributeNUMANode:     v1alpha1.AttributeTypeInt,
	}
}

// Discover reads the pools from sysfs.
func (Kind) Discover(opts devicekind.DiscoverOptions) ([]v1alpha1.Device, metav1.Condition) {
	pools, err := hpdiscovery.Discover(hpdiscovery.Options{HostRoot: opts.HostRoot})
	return pools, devicekind.DiscoveryCondition(Condition, err, fmt.Sprintf("%d hugepage pools", len(pools)))
}

// Allocation: a pool is shared by the pods it serves.
func (Kind) Allocation(*v1alpha1.Device) devicekind.Allocation { return devicekind.Pool }

// NodeCapacity: the kubelet reports the pages of a pool as node capacity,
// hugepages-<size>.
func (Kind) NodeCapacity(d *v1alpha1.Device, c corev1.ResourceList) {
	size, total := d.Attributes[v1alpha1.AttributeSize].QuantityValue, d.Attributes[v1alpha1.AttributePagesTotal].IntValue
	if size == nil || total == nil {
		return
	}
	name := corev1.ResourceName(corev1.ResourceHugePagesPrefix + size.String())
	q := c[name]
	q.Add(*resource.NewQuantity(size.Value()**total, resource.BinarySI))
	c[name] = q
}

// LabelKeys lists the labels of the kind.
func (Kind) LabelKeys() []string { return []string{LabelSizes} }

// Labels list the sizes that have pages.
func (Kind) Labels(devices []*v1alpha1.Device) map[string]string {
	labels := map[string]string{}
	sizes := map[int64]string{}
	for _, d := range devices {
		total := d.Attributes[v1alpha1.AttributePagesTotal].IntValue
		size := d.Attributes[v1alpha1.AttributeSize].QuantityValue
		if size != nil && total != nil && *total > 0 {
			sizes[size.Value()] = size.String()
		}
	}
	if len(sizes) == 0 {
		return labels
	}
	keys := make([]int64, 0, len(sizes))
	for k := range sizes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = sizes[k]
	}
	labels[LabelSizes] = strings.Join(names, "_")
	return labels
}

// Summarize counts pools.
func (Kind) Summarize(s v1alpha1.DeviceSummary, _ *v1alpha1.Device) v1alpha1.DeviceSummary {
	s.HugePagePools++
	return s
}

// ContainerEdits name the container's pools, their page sizes and NUMA nodes
// (absent for machine-wide pools: there is no node to name).
func (Kind) ContainerEdits(_ *devicekind.Handoff, _, all []*v1alpha1.Device, e *devicekind.ContainerEdits) error {
	ids := make([]string, len(all))
	var sizes, numa []string
	for i, d := range all {
		ids[i] = d.ID
		if q := d.Attributes[v1alpha1.AttributeSize].QuantityValue; q != nil {
			sizes = append(sizes, q.String())
		}
		if n := d.Attributes[v1alpha1.AttributeNUMANode].IntValue; n != nil {
			numa = append(numa, strconv.FormatInt(*n, 10))
		}
	}
	e.Env[EnvPool] = strings.Join(ids, ",")
	e.Env[EnvSize] = strings.Join(sizes, ",")
	if len(numa) == len(all) {
		e.Env[EnvNUMANode] = strings.Join(numa, ",")
	}
	return nil
}
