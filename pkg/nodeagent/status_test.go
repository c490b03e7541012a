package nodeagent

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/pkg/introspection"
	agentv1 "github.com/resclass/resclass/proto/resclass/agent/v1"
)

// statusSource is a fixed introspection.Source with a real HealthHub.
type statusSource struct {
	*introspection.HealthHub
	devices     []*agentv1.Device
	allocations []*agentv1.Allocation
}

func (s *statusSource) Devices() []*agentv1.Device         { return s.devices }
func (s *statusSource) Allocations() []*agentv1.Allocation { return s.allocations }

func newStatusSource() *statusSource {
	src := &statusSource{
		HealthHub: introspection.NewHealthHub(0),
		devices: []*agentv1.Device{
			{Id: "GPU-0c1b", Kind: "nvidia-gpu", Healthy: true, NumaNode: 0, Classes: []string{"a100", "any-gpu"}, Attributes: map[string]string{"memory": "80Gi"}},
			{Id: "GPU-9f2e", Kind: "nvidia-gpu", Reason: "XID 79: GPU fell off the bus", NumaNode: 1, Classes: []string{"a100"}},
			{Id: "hugepages-1Gi", Kind: "huge-pages", Healthy: true, NumaNode: -1},
		},
		allocations: []*agentv1.Allocation{
			{PodNamespace: "ml", PodName: "train-0", PodUid: "u0", Container: "main", ClassName: "a100", DeviceIds: []string{"GPU-0c1b"}, Time: timestamppb.New(time.Now().Add(-90 * time.Minute)), Outcome: "allocated"},
			{PodNamespace: "ml", PodName: "train-1", PodUid: "u1", Container: "main", ClassName: "a100", Time: timestamppb.New(time.Now().Add(-30 * time.Minute)), Outcome: "refused", Message: "no healthy a100 left"},
		},
	}
	for _, d := range src.devices {
		src.Publish(&agentv1.HealthEvent{DeviceId: d.Id, Kind: d.Kind, Healthy: d.Healthy, Reason: d.Reason})
	}
	return src
}

// serveStatus serves src on a socket in a temporary directory until the test ends.
func serveStatus(t *testing.T, src introspection.Source) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "agent.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- introspection.Serve(ctx, socket, src) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if fi, err := os.Stat(socket); err == nil && fi.Mode().Type() == fs.ModeSocket {
			return socket
		}
		if time.Now().After(deadline) {
			t.Fatalf("no socket at %s", socket)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func runStatus(t *testing.T, ctx context.Context, out *syncBuffer, args ...string) error {
	t.Helper()
	cmd := NewCommand()
	cmd.SetArgs(append([]string{"status"}, args...))
	cmd.SetOut(out)
	cmd.SetErr(out)
	return cmd.ExecuteContext(ctx)
}

func TestStatusTable(t *testing.T) {
	socket := serveStatus(t, newStatusSource())
	var out syncBuffer
	if err := runStatus(t, context.Background(), &out, "--socket", socket); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"DEVICES\n",
		"ID             KIND        HEALTH                                   NUMA  CLASSES\n",
		"GPU-0c1b       nvidia-gpu  healthy                                  0     a100,any-gpu\n",
		"GPU-9f2e       nvidia-gpu  unhealthy: XID 79: GPU fell off the bus  1     a100\n",
		"hugepages-1Gi  huge-pages  healthy                                  -     <none>\n",
		"\nALLOCATIONS\n",
		"POD         CONTAINER  CLASS  DEVICES   OUTCOME                        AGE\n",
		"ml/train-0  main       a100   GPU-0c1b  allocated                      90m\n",
		"ml/train-1  main       a100   -         refused: no healthy a100 left  30m\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
}

func TestStatusTableEmpty(t *testing.T) {
	socket := serveStatus(t, &statusSource{HealthHub: introspection.NewHealthHub(0)})
	var out syncBuffer
	if err := runStatus(t, context.Background(), &out, "--socket", socket); err != nil {
		t.Fatal(err)
	}
	if want := "DEVICES\n(none discovered)\n\nALLOCATIONS\n(none)\n"; out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}
}

type statusDocument struct {
	Devices []struct {
		ID         string            `json:"id"`
		Kind       string            `json:"kind"`
		Healthy    bool              `json:"healthy"`
		Reason     string            `json:"reason"`
		NUMANode   *int32            `json:"numaNode"`
		Classes    []string          `json:"classes"`
		Attributes map[string]string `json:"attributes"`
	} `json:"devices"`
	Allocations []struct {
		PodNamespace string    `json:"podNamespace"`
		PodName      string    `json:"podName"`
		PodUID       string    `json:"podUid"`
		Container    string    `json:"container"`
		ClassName    string    `json:"className"`
		DeviceIDs    []string  `json:"deviceIds"`
		Time         time.Time `json:"time"`
		Outcome      string    `json:"outcome"`
		Message      string    `json:"message"`
		// int64 values are strings in the protobuf JSON mapping.
		Share map[string]string `json:"share"`
	} `json:"allocations"`
}

func TestStatusJSONAndYAML(t *testing.T) {
	src := newStatusSource()
	socket := serveStatus(t, src)
	for _, format := range []string{"json", "yaml"} {
		t.Run(format, func(t *testing.T) {
			var out syncBuffer
			if err := runStatus(t, context.Background(), &out, "--socket", socket, "-o", format); err != nil {
				t.Fatal(err)
			}
			data := out.Bytes()
			if format == "yaml" {
				var err error
				if data, err = yaml.YAMLToJSON(data); err != nil {
					t.Fatal(err)
				}
			}
			var doc statusDocument
			dec := json.NewDecoder(bytes.NewReader(data))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&doc); err != nil {
				t.Fatalf("%v in:\n%s", err, out.String())
			}
			if len(doc.Devices) != 3 || len(doc.Allocations) != 2 {
				t.Fatalf("%d devices and %d allocations, want 3 and 2", len(doc.Devices), len(doc.Allocations))
			}
			d := doc.Devices[0]
			if d.ID != "GPU-0c1b" || d.NUMANode == nil || *d.NUMANode != 0 || d.Attributes["memory"] != "80Gi" || strings.Join(d.Classes, ",") != "a100,any-gpu" {
				t.Errorf("device %+v", d)
			}
			if d := doc.Devices[1]; d.Healthy || d.Reason != "XID 79: GPU fell off the bus" {
				t.Errorf("device %+v", d)
			}
			if d := doc.Devices[2]; d.NUMANode == nil || *d.NUMANode != -1 {
				t.Errorf("device %+v, want numaNode -1", d)
			}
			a := doc.Allocations[0]
			if a.PodName != "train-0" || a.PodUID != "u0" || a.DeviceIDs[0] != "GPU-0c1b" || a.Outcome != "allocated" || !a.Time.Equal(src.allocations[0].Time.AsTime()) {
				t.Errorf("allocation %+v", a)
			}
		})
	}
}

func TestStatusWatch(t *testing.T) {
	for _, format := range []string{"table", "json"} {
		t.Run(format, func(t *testing.T) {
			src := newStatusSource()
			socket := serveStatus(t, src)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var out syncBuffer
			done := make(chan error, 1)
			go func() { done <- runStatus(t, ctx, &out, "--socket", socket, "--watch", "-o", format) }()

			// The current state of every device first...
			waitForOutput(t, &out, "hugepages-1Gi")
			// ...then changes.
			src.Publish(&agentv1.HealthEvent{DeviceId: "GPU-9f2e", Kind: "nvidia-gpu", Healthy: true, Reason: "recovered", Time: timestamppb.Now()})
			waitForOutput(t, &out, "recovered")
			cancel() // Ctrl-C
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("an interrupted watch is a success, got %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the watch did not end when interrupted")
			}

			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			switch format {
			case "table":
				if len(lines) != 5 || !strings.HasPrefix(lines[0], "TIME") {
					t.Fatalf("want a header and 4 events, got:\n%s", out.String())
				}
				for i, want := range []string{"GPU-0c1b", "GPU-9f2e", "hugepages-1Gi", "GPU-9f2e"} {
					if !strings.Contains(lines[i+1], want) {
						t.Errorf("line %d: %q, want %s", i+1, lines[i+1], want)
					}
				}
				if !strings.Contains(lines[2], "unhealthy: XID 79") || !strings.Contains(lines[4], "healthy: recovered") {
					t.Errorf("health columns wrong:\n%s", out.String())
				}
			case "json":
				if len(lines) != 4 {
					t.Fatalf("want 4 JSON lines, got:\n%s", out.String())
				}
				var ev struct {
					DeviceID string `json:"deviceId"`
					Healthy  bool   `json:"healthy"`
					Reason   string `json:"reason"`
				}
				if err := json.Unmarshal([]byte(lines[3]), &ev); err != nil {
					t.Fatal(err)
				}
				if ev.DeviceID != "GPU-9f2e" || !ev.Healthy || ev.Reason != "recovered" {
					t.Errorf("last event %+v", ev)
				}
			}
		})
	}
}

func TestStatusMissingSocket(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "agent.sock")
	var out syncBuffer
	err := runStatus(t, context.Background(), &out, "--socket", socket)
	if err == nil || !strings.Contains(err.Error(), "is the node agent running on this node? it serves "+socket) {
		t.Errorf("got %v, want the hint that the agent is not running", err)
	}
}

func TestStatusStaleSocket(t *testing.T) {
	// A socket file nobody listens on: an agent that died without removing it.
	socket := filepath.Join(t.TempDir(), "agent.sock")
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	lis.SetUnlinkOnClose(false)
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	err = runStatus(t, context.Background(), &out, "--socket", socket)
	if err == nil || !strings.Contains(err.Error(), "cannot reach the node agent") || !strings.Contains(err.Error(), "is the node agent running on this node? it serves "+socket) {
		t.Errorf("got %v, want the hint that the agent is not running", err)
	}
}

func TestStatusUnknownOutput(t *testing.T) {
	var out syncBuffer
	err := runStatus(t, context.Background(), &out, "--socket", "/nonexistent", "-o", "wide")
	if err == nil || !strings.Contains(err.Error(), `unknown output format "wide"`) {
		t.Errorf("got %v", err)
	}
}

func waitForOutput(t *testing.T, out *syncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the output after 10s:\n%s", want, out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// syncBuffer is a bytes.Buffer that a command may write while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}
