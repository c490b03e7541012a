package inventory

import (
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/attrvalue"
)

// The node labels the agent maintains. They summarise the inventory for
// `kubectl get nodes -L` and nodeSelectors; selecting devices is the job of
// ResourceClasses, so the set stays small. A label is absent when its value
// would be empty (no GPU, no NIC, no hugepage pool).
const (
	LabelPrefix = "resclass.io/"
	// LabelGPUCount is the number of GPUs (whole GPUs, MIG mode or not).
	LabelGPUCount = LabelPrefix + "gpu.count"
	// LabelGPUProduct is the GPUs' product name with spaces as dashes
	// ("NVIDIA-A100-SXM4-40GB"), or "mixed" when the node has several.
	LabelGPUProduct = LabelPrefix + "gpu.product"
	// LabelGPUMemory is the memory of the node's smallest GPU ("40Gi").
	LabelGPUMemory = LabelPrefix + "gpu.memory"
	// LabelGPUMIG is "true" when a GPU is in MIG mode.
	LabelGPUMIG = LabelPrefix + "gpu.mig"
	// LabelNICCount is the number of NICs (hardware ones, as discovered).
	LabelNICCount = LabelPrefix + "nic.count"
	// LabelNICSpeed is the fastest NIC link speed ("100Gbps").
	LabelNICSpeed = LabelPrefix + "nic.speed"
	// LabelHugePageSizes lists the hugepage sizes with pages, smallest first,
	// joined by "_" ("2Mi_1Gi").
	LabelHugePageSizes = LabelPrefix + "hugepages.sizes"
)

// IsLabel says whether key is one of the labels the agent maintains.
func IsLabel(key string) bool {
	switch key {
	case LabelGPUCount, LabelGPUProduct, LabelGPUMemory, LabelGPUMIG, LabelNICCount, LabelNICSpeed, LabelHugePageSizes:
		return true
	}
	return false
}

// NodeLabels computes the labels for a node's devices.
func NodeLabels(devices []v1alpha1.Device) map[string]string {
	labels := map[string]string{}
	var (
		gpus, nics   int
		products     = map[string]bool{}
		minMemory    *resource.Quantity
		mig          bool
		maxSpeed     int64
		sizes        = map[int64]string{}
		gpuProductOK = true
	)
	for _, d := range devices {
		a := d.Attributes
		switch d.Kind {
		case v1alpha1.DeviceKindNvidiaGPU:
			gpus++
			if p := a[v1alpha1.AttributeProduct].StringValue; p != nil {
				products[*p] = true
			} else {
				gpuProductOK = false
			}
			if m := a[v1alpha1.AttributeMemory].QuantityValue; m != nil && (minMemory == nil || m.Cmp(*minMemory) < 0) {
				minMemory = m
			}
			if b := a[v1alpha1.AttributeMIGEnabled].BoolValue; b != nil && *b {
				mig = true
			}
		case v1alpha1.DeviceKindNIC:
			nics++
			if s := a[v1alpha1.AttributeSpeed].BandwidthValue; s != nil {
				if q, err := attrvalue.ParseBandwidth(*s); err == nil && q.Value() > maxSpeed {
					maxSpeed = q.Value()
				}
			}
		case v1alpha1.DeviceKindHugePages:
			total := a[v1alpha1.AttributePagesTotal].IntValue
			size := a[v1alpha1.AttributeSize].QuantityValue
			if size != nil && total != nil && *total > 0 {
				sizes[size.Value()] = size.String()
			}
		}
	}
	if gpus > 0 {
		labels[LabelGPUCount] = strconv.Itoa(gpus)
		switch {
		case len(products) == 1 && gpuProductOK:
			for p := range products {
				if v := labelValue(p); v != "" {
					labels[LabelGPUProduct] = v
				}
			}
		case len(products) > 1:
			labels[LabelGPUProduct] = "mixed"
		}
		if minMemory != nil {
			labels[LabelGPUMemory] = minMemory.String()
		}
		if mig {
			labels[LabelGPUMIG] = "true"
		}
	}
	if nics > 0 {
		labels[LabelNICCount] = strconv.Itoa(nics)
		if maxSpeed > 0 {
			labels[LabelNICSpeed] = attrvalue.FormatBandwidth(maxSpeed)
		}
	}
	if len(sizes) > 0 {
		keys := make([]int64, 0, len(sizes))
		for k := range sizes {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
		names := make([]string, len(keys))
		for i, k := range keys {
			names[i] = sizes[k]
		}
		labels[LabelHugePageSizes] = strings.Join(names, "_")
	}
	return labels
}

// labelValue turns a product name into a label value: spaces become dashes,
// other characters a label value cannot hold are dropped, and the value is cut
// to 63 characters on an alphanumeric.
func labelValue(s string) string {
	var b strings.Builder
	for _, c := range strings.TrimSpace(s) {
		switch {
		case c == ' ':
			b.WriteByte('-')
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
			b.WriteRune(c)
		}
	}
	v := b.String()
	if len(v) > validation.LabelValueMaxLength {
		v = v[:validation.LabelValueMaxLength]
	}
	return strings.Trim(v, "-_.")
}
