package nodeagent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/hugepages"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nic"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
)

func mockStatus(t *testing.T) v1alpha1.NodeDevicesStatus {
	t.Helper()
	s := newSources(kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{Binding: nvmlmock.New()}}), devicekind.DiscoverOptions{HostRoot: t.TempDir()})
	defer s.close()
	s.describeOnce()
	gpus, conds := s.described()
	if len(conds) != 1 || conds[0].Type != nvidiagpu.Condition || conds[0].Status != metav1.ConditionTrue || conds[0].Message != "8 GPUs" {
		t.Fatalf("NVML condition %+v", conds)
	}
	return assemble(s.kinds, gpus)
}

func TestOutputFormats(t *testing.T) {
	status := mockStatus(t)
	if status.Summary.GPUs != 8 {
		t.Fatalf("summary %+v, want 8 GPUs", status.Summary)
	}
	for _, format := range []string{"yaml", "json"} {
		t.Run(format, func(t *testing.T) {
			var out bytes.Buffer
			if err := write(&out, status, format); err != nil {
				t.Fatal(err)
			}
			var back v1alpha1.NodeDevicesStatus
			var err error
			if format == "json" {
				err = json.Unmarshal(out.Bytes(), &back)
			} else {
				err = yaml.UnmarshalStrict(out.Bytes(), &back)
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back.Summary, status.Summary) || len(back.Devices) != 8 || back.Devices[3].ID != status.Devices[3].ID {
				t.Errorf("%s output does not read back as the status", format)
			}
		})
	}
	var out bytes.Buffer
	if err := write(&out, status, "table"); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 9 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[1], "memory=40Gi") || !strings.Contains(lines[1], "nvidia-gpu  yes") {
		t.Errorf("table:\n%s", out.String())
	}
	if err := write(&out, status, "xml"); err == nil || !strings.Contains(err.Error(), "use table, yaml or json") {
		t.Errorf("unknown format: err = %v", err)
	}
}

// TestDiscoverThisMachine runs discovery as `node-agent discover` does. Without
// NVML (CI), the GPU source reports itself unavailable instead of failing.
func TestDiscoverThisMachine(t *testing.T) {
	status := discover(discoverOptions{hostRoot: "/"})
	c := meta.FindStatusCondition(status.Conditions, nvidiagpu.Condition)
	if c == nil {
		t.Fatalf("no %s condition: %+v", nvidiagpu.Condition, status.Conditions)
	}
	t.Logf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message)
	if c.Status == "False" && (c.Reason != "Unavailable" || status.Summary.GPUs != 0) {
		t.Errorf("without NVML: reason %q and %d GPUs, want Unavailable and none", c.Reason, status.Summary.GPUs)
	}
	nics := meta.FindStatusCondition(status.Conditions, nic.Condition)
	if nics == nil || nics.Status != "True" {
		t.Fatalf("%s condition: %+v", nic.Condition, nics)
	}
	if want := fmt.Sprintf("%d NICs", status.Summary.NICs); nics.Message != want {
		t.Errorf("%s says %q, the summary counts %q", nic.Condition, nics.Message, want)
	}
	hp := meta.FindStatusCondition(status.Conditions, hugepages.Condition)
	if hp == nil || hp.Status != "True" {
		t.Fatalf("%s condition: %+v", hugepages.Condition, hp)
	}
	if want := fmt.Sprintf("%d hugepage pools", status.Summary.HugePagePools); hp.Message != want {
		t.Errorf("%s says %q, the summary counts %q", hugepages.Condition, hp.Message, want)
	}
}

func TestSummarize(t *testing.T) {
	got := kinds.Builtin.Summarize([]v1alpha1.Device{
		{Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true},
		{Kind: v1alpha1.DeviceKindNvidiaGPU},
		{Kind: v1alpha1.DeviceKindNIC, Healthy: true},
		{Kind: v1alpha1.DeviceKindHugePages, Healthy: true},
		{Kind: "fpga", Healthy: true},
	})
	if want := (v1alpha1.DeviceSummary{GPUs: 2, NICs: 1, HugePagePools: 1, Unhealthy: 1}); got != want {
		t.Errorf("Summarize = %+v, want %+v", got, want)
	}
}

// --ignored-xids is parsed by nvml.ParseXIDs: a bad entry stops the agent at
// start, naming it; repeated flags add up.
func TestIgnoredXIDsFlag(t *testing.T) {
	cmd := &cobra.Command{Use: "serve", RunE: func(*cobra.Command, []string) error { return nil }}
	var o serveOptions
	o.addFlags(cmd)
	if err := cmd.ParseFlags([]string{"--ignored-xids=94,95", "--ignored-xids", "95,120"}); err != nil {
		t.Fatal(err)
	}
	if got := o.ignoredXIDs.String(); got != "94,95,120" {
		t.Errorf("--ignored-xids = %s", got)
	}
	err := cmd.ParseFlags([]string{"--ignored-xids=94,1e999999999"})
	if err == nil || !strings.Contains(err.Error(), `entry 2, "1e999999999", is not an XID`) {
		t.Errorf("a bad XID: %v", err)
	}
}
