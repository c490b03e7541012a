package kubectlplugin

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/mig"
)

// TestMIG: kubectl resclass mig reads each MIG-mode GPU's published
// geometry: its instances, the slices free, the largest profile still
// creatable and how many of each; a geometry that describes no possible GPU
// is shown as unreadable, not guessed at.
func TestMIG(t *testing.T) {
	geometry := mig.A100_40GB.API
	product := v1alpha1.StringAttribute("NVIDIA A100-SXM4-40GB")
	gpu := func(id string, m *v1alpha1.DeviceMIG) v1alpha1.Device {
		return v1alpha1.Device{ID: id, Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, MIG: m,
			Attributes: map[string]v1alpha1.DeviceAttribute{v1alpha1.AttributeProduct: product}}
	}
	broken := geometry(v1alpha1.MIGInstance{Profile: "4g.20gb", Start: 0}, v1alpha1.MIGInstance{Profile: "3g.20gb", Start: 0})
	n1 := v1alpha1.NodeDevices{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	n1.Status.Devices = []v1alpha1.Device{
		gpu("GPU-b", func() *v1alpha1.DeviceMIG {
			m := geometry(v1alpha1.MIGInstance{Profile: "4g.20gb", Start: 0}, v1alpha1.MIGInstance{Profile: "1g.5gb", Start: 6, Created: true})
			m.Mode = v1alpha1.MIGDynamic
			return m
		}()),
		gpu("GPU-a", geometry()),
		{ID: "GPU-c", Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true}, // not in MIG mode
	}
	n2 := v1alpha1.NodeDevices{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}
	n2.Status.Devices = []v1alpha1.Device{gpu("GPU-d", broken),
		gpu("GPU-e", &v1alpha1.DeviceMIG{Mode: v1alpha1.MIGStatic, Message: "the GPU's MIG mode is off"})}

	got := migGPUs([]v1alpha1.NodeDevices{n2, n1}, "")
	if len(got) != 4 || got[0].GPU != "GPU-a" || got[1].GPU != "GPU-b" || got[2].GPU != "GPU-d" || got[3].GPU != "GPU-e" {
		t.Fatalf("GPUs %+v", got)
	}
	if got[0].Mode != "Static" || got[1].Mode != "Dynamic" || fmt.Sprint(got[1].Created) != "[1g.5gb@6]" {
		t.Errorf("modes %s %s, created %v", got[0].Mode, got[1].Mode, got[1].Created)
	}
	count := func(g MIGGPU, profile string) int {
		for _, c := range g.Creatable {
			if c.Profile == profile {
				return c.Count
			}
		}
		return -1
	}
	if a := got[0]; len(a.Instances) != 0 || a.FreeSlices != 8 || a.Largest != "7g.40gb" || count(a, "1g.5gb") != 7 || count(a, "1g.5gb+me") != 1 || len(a.Creatable) != 7 {
		t.Errorf("a GPU without instances: %+v", a)
	}
	// 4g.20gb at 0 and 1g.5gb at 6: slices 4, 5 and 7 free. 2g.10gb or
	// 1g.10gb fit at 4; two 1g.5gb (4, 5); nothing of 4 slices.
	b := got[1]
	if strings.Join(b.Instances, ",") != "4g.20gb@0,1g.5gb@6" || b.FreeSlices != 3 || b.Largest != "2g.10gb" ||
		count(b, "1g.5gb") != 2 || count(b, "2g.10gb") != 1 || count(b, "1g.10gb") != 1 || count(b, "3g.20gb") != 0 {
		t.Errorf("a partitioned GPU: %+v", b)
	}
	if d := got[2]; d.Error == "" || len(d.Creatable) != 0 {
		t.Errorf("overlapping instances were read: %+v", d)
	}
	if only := migGPUs([]v1alpha1.NodeDevices{n2, n1}, "n2"); len(only) != 2 || only[0].Node != "n2" {
		t.Errorf("--node n2: %+v", only)
	}

	// The table.
	var out bytes.Buffer
	o := &options{}
	o.streams.Out = &out
	if err := o.print(got, func(tb *table) { migTable(tb, got) }); err != nil {
		t.Fatal(err)
	}
	table := map[string]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			table[f[1]] = strings.Join(f, " ")
		}
	}
	for _, want := range []string{
		"n1 GPU-b Dynamic 4g.20gb@0,1g.5gb@6(created) 3/8 2g.10gb 1g.5gb×2 1g.5gb+me×1 1g.10gb×1 2g.10gb×1",
		"n2 GPU-d Static (unreadable: NVIDIA A100-SXM4-40GB: 3g.20gb at 0 does not fit (slices in use 00001111))",
		"n2 GPU-e Static (the GPU's MIG mode is off)",
	} {
		if got := table[strings.Fields(want)[1]]; got != want {
			t.Errorf("row %q, want %q", got, want)
		}
	}
}
