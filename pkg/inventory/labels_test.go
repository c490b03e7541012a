package inventory

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/internal/watchdog"
)

func gpu(product, memory string, mig bool) v1alpha1.Device {
	return v1alpha1.Device{Kind: v1alpha1.DeviceKindNvidiaGPU, Attributes: map[string]v1alpha1.DeviceAttribute{
		v1alpha1.AttributeProduct:    v1alpha1.StringAttribute(product),
		v1alpha1.AttributeMemory:     v1alpha1.QuantityAttribute(resource.MustParse(memory)),
		v1alpha1.AttributeMIGEnabled: v1alpha1.BoolAttribute(mig),
	}}
}

func nic(speed string) v1alpha1.Device {
	d := v1alpha1.Device{Kind: v1alpha1.DeviceKindNIC, Attributes: map[string]v1alpha1.DeviceAttribute{}}
	if speed != "" {
		d.Attributes[v1alpha1.AttributeSpeed] = v1alpha1.BandwidthAttribute(speed)
	}
	return d
}

func pool(size string, total int64) v1alpha1.Device {
	return v1alpha1.Device{Kind: v1alpha1.DeviceKindHugePages, Attributes: map[string]v1alpha1.DeviceAttribute{
		v1alpha1.AttributeSize:       v1alpha1.QuantityAttribute(resource.MustParse(size)),
		v1alpha1.AttributePagesTotal: v1alpha1.IntAttribute(total),
	}}
}

func TestNodeLabels(t *testing.T) {
	for _, tc := range []struct {
		name    string
		devices []v1alpha1.Device
		want    map[string]string
	}{
		{"nothing", nil, map[string]string{}},
		{"one product", []v1alpha1.Device{gpu("NVIDIA A100-SXM4-80GB", "80Gi", false), gpu("NVIDIA A100-SXM4-80GB", "80Gi", true)}, map[string]string{
			LabelGPUCount: "2", LabelGPUProduct: "NVIDIA-A100-SXM4-80GB", LabelGPUMemory: "80Gi", LabelGPUMIG: "true",
		}},
		{"mixed products, smallest memory", []v1alpha1.Device{gpu("Tesla T4", "15Gi", false), gpu("NVIDIA H100 80GB HBM3", "81559Mi", false)}, map[string]string{
			LabelGPUCount: "2", LabelGPUProduct: "mixed", LabelGPUMemory: "15Gi",
		}},
		{"NICs, fastest link; hugepage sizes with pages", []v1alpha1.Device{nic("25000Mbps"), nic("100Gbps"), nic(""), pool("1Gi", 8), pool("2Mi", 512), pool("2Mi", 0), pool("32Mi", 0)}, map[string]string{
			LabelNICCount: "3", LabelNICSpeed: "100Gbps", LabelHugePageSizes: "2Mi_1Gi",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := NodeLabels(tc.devices)
			if len(got) != len(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q (all: %v)", k, got[k], v, got)
				}
			}
			for k, v := range got {
				if !IsLabel(k) || len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
					t.Errorf("label %s=%q is not a valid resclass label", k, v)
				}
			}
		})
	}
}

func TestLabelsApplied(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"team": "a", LabelGPUCount: "8", LabelNICCount: "2"}}}
	if !labelsApplied(node, map[string]string{LabelGPUCount: "8", LabelNICCount: "2"}) {
		t.Error("same resclass labels, other labels aside: want applied")
	}
	if labelsApplied(node, map[string]string{LabelGPUCount: "8"}) {
		t.Error("a resclass label to remove: want not applied")
	}
	if labelsApplied(node, map[string]string{LabelGPUCount: "7", LabelNICCount: "2"}) {
		t.Error("a changed value: want not applied")
	}
}

func TestMergeConditionsKeepsTransitionTime(t *testing.T) {
	then := metav1.NewTime(metav1.Now().Add(-3600e9).Truncate(1e9))
	prev := []metav1.Condition{
		{Type: "A", Status: metav1.ConditionTrue, Reason: "Discovered", Message: "8 GPUs", LastTransitionTime: then},
		{Type: "B", Status: metav1.ConditionTrue, Reason: "Discovered", LastTransitionTime: then},
	}
	next := mergeConditions(prev, []metav1.Condition{
		{Type: "A", Status: metav1.ConditionTrue, Reason: "Discovered", Message: "7 GPUs"},
		{Type: "B", Status: metav1.ConditionFalse, Reason: "Failed"},
	})
	if !next[0].LastTransitionTime.Equal(&then) || next[0].Message != "7 GPUs" {
		t.Errorf("unchanged status: %+v, want the old transition time and the new message", next[0])
	}
	if next[1].LastTransitionTime.Equal(&then) || next[1].LastTransitionTime.IsZero() {
		t.Errorf("changed status: %+v, want a new transition time", next[1])
	}
}

func FuzzLabelValue(f *testing.F) {
	for _, s := range []string{"NVIDIA A100-SXM4-80GB", " Tesla T4 ", "-x-", "Ünïcode GPU", "a/b:c", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		watchdog.Run(t, func() {
			v := labelValue(s)
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				t.Fatalf("labelValue(%q) = %q: %v", s, v, errs)
			}
		})
	})
}
