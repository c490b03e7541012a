package framework

import (
	"strings"
	"testing"
)

func TestParseSamples(t *testing.T) {
	text := `# HELP x y
# TYPE scheduler_plugin_execution_duration_seconds histogram
scheduler_plugin_execution_duration_seconds_sum{extension_point="Filter",plugin="ResourceClasses",status="Success"} 1.5
scheduler_plugin_execution_duration_seconds_sum{extension_point="Filter",plugin="NodeResourcesFit",status="Success"} 2
scheduler_plugin_execution_duration_seconds_sum{extension_point="Score",plugin="ResourceClasses",status="Success"} 0.25
apiserver_request_total{resource="pods",verb="POST",note="a \"quoted\", value"} 7 1700000000000
etcd_disk_wal_write_bytes_total 4096
`
	s, err := parseSamples(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 5 {
		t.Fatalf("%d samples, want 5: %+v", len(s), s)
	}
	const name = "scheduler_plugin_execution_duration_seconds_sum"
	if got := s.Sum(name, "plugin=ResourceClasses"); got != 1.75 {
		t.Errorf("ResourceClasses sum %v, want 1.75", got)
	}
	if got := s.Sum(name, "extension_point=Filter", "plugin=*"); got != 3.5 {
		t.Errorf("Filter sum %v, want 3.5", got)
	}
	if got := s.By(name, "extension_point", "plugin=ResourceClasses"); got["Filter"] != 1.5 || got["Score"] != 0.25 {
		t.Errorf("by extension point %v", got)
	}
	if got := s.Sum("apiserver_request_total", `note=a "quoted", value`); got != 7 {
		t.Errorf("quoted label: %v, want 7 (timestamp ignored)", got)
	}
	if got := s.Sum("etcd_disk_wal_write_bytes_total"); got != 4096 {
		t.Errorf("unlabelled sample %v, want 4096", got)
	}
	for _, bad := range []string{"x{a=\"1\" 2", "x{a=1} 2", "x{a=\"1\"} two", "lonely"} {
		if _, err := parseSamples(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed; want an error", bad)
		}
	}
}

// FuzzParseSamples: whatever a /metrics body holds, parsing returns an error or
// samples, without panicking. (pkg/internal/watchdog is internal to pkg/; the
// parser is one pass over the input, with no loop that does not advance.)
func FuzzParseSamples(f *testing.F) {
	f.Add("a_total{x=\"1\",y=\"\\\"\"} 3\nb 4 5\n# c\n")
	f.Add("a{} 1\n")
	f.Add("a{x=\"\\") // an unterminated escape
	f.Fuzz(func(t *testing.T, text string) {
		s, err := parseSamples(strings.NewReader(text))
		if err != nil {
			return
		}
		if strings.TrimSpace(text) == "" && len(s) > 0 {
			t.Errorf("samples from blank input: %+v", s)
		}
	})
}

func TestParseVMStat(t *testing.T) {
	raw := "nr_free_pages 123\nallocstall_dma 0\nallocstall_normal 75\nallocstall_movable 4375\npgscan_direct 271302\npgscan_direct_throttle 9\nbroken\npgscan_kswapd x\n"
	stalls, scanned := parseVMStat(raw)
	if stalls != 4450 || scanned != 271302 {
		t.Errorf("parseVMStat: %d stalls, %d scanned; want 4450, 271302", stalls, scanned)
	}
}
