package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	"github.com/resclass/resclass/pkg/deviceplugin"
	"github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// sent closes its channel once a call's request is on the wire: the server
// then takes it, even if it starts to stop at once.
type sent chan struct{}

func (s sent) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (s sent) HandleRPC(_ context.Context, st stats.RPCStats) {
	if _, ok := st.(*stats.OutPayload); ok {
		close(s)
	}
}
func (sent) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (sent) HandleConn(context.Context, stats.ConnStats)                       {}

// SIGTERM (the agent's context ends) while the kubelet's Allocate waits for
// its pod to reach the agent's cache: the endpoint's socket goes at once, the
// agent keeps its pod informer running, and the Allocate is answered with
// the pod's devices when the pod is bound meanwhile; then the agent exits.
// It used to stop its endpoints outright, failing that pod's admission.
func TestNodeAgentDrainsAllocateOnSIGTERM(t *testing.T) {
	ctx, cancel := agentTest(t, 3*time.Minute)
	defer cancel()
	const node, class = "drain-on-sigterm", "e2e-drain-gpu"
	schedClass(t, ctx, class, v1alpha1.ResourceSelectorRequirement{Key: "kind", Operator: v1alpha1.ResourceSelectorOpIn, Values: []string{"nvidia-gpu"}})
	arc, akc := robustNode(t, ctx, node)
	dgx, root := mockDGX(t)
	pluginDir := t.TempDir()
	endpoint := filepath.Join(pluginDir, deviceplugin.SocketName(v1alpha1.ResourceNamePrefix+class))
	agent := nodeagent.New(nodeagent.Config{
		NodeName: node, HostRoot: root,
		Kinds:        kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{Binding: dgx, Health: nvml.HealthOptions{WaitTimeout: 100 * time.Millisecond}}}),
		PollInterval: 200 * time.Millisecond, ResyncInterval: time.Hour,
		PluginDir: pluginDir, CDISpecDir: filepath.Join(t.TempDir(), "cdi"),
		// Long enough that the pod is bound while the call waits.
		WaitForPod: time.Minute,
	}, arc, akc)
	stop, exited := runAgent(t, ctx, agent)
	waitFile(t, ctx, endpoint)

	// The kubelet's Allocate for a GPU whose pod the agent has not seen.
	gpu := dgx.UUIDs()[3]
	onWire := make(sent)
	conn, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStatsHandler(onWire))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	type answer struct {
		resp *pluginapi.AllocateResponse
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		// WaitForReady: the socket exists before its server serves (and a
		// self-check may restart it), and a call that fails fast on the
		// connection never reaches the wire.
		resp, err := pluginapi.NewDevicePluginClient(conn).Allocate(ctx, &pluginapi.AllocateRequest{
			ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{gpu}}},
		}, grpc.WaitForReady(true))
		answered <- answer{resp, err}
	}()
	select {
	case <-onWire:
	case a := <-answered:
		t.Fatalf("Allocate answered before it was sent: %v, %v", a.resp, a.err)
	}

	// SIGTERM.
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	poll(t, ctx, 30*time.Second, "the endpoint's socket removed", func(context.Context) (bool, error) {
		_, err := os.Stat(endpoint)
		return errors.Is(err, os.ErrNotExist), nil
	})
	select {
	case a := <-answered:
		t.Fatalf("Allocate answered before its pod existed: %v, %v", a.resp, a.err)
	case <-exited:
		t.Fatal("the agent exited with an Allocate in flight")
	default:
	}

	// The scheduler binds the pod meanwhile.
	ns := newNamespace(t, ctx, nil)
	classPod(t, ctx, ns, "late", node, []containerSpec{{name: "train", classes: map[string][]string{class: {gpu}}}})
	a := <-answered
	if a.err != nil {
		t.Fatalf("Allocate in flight at SIGTERM: %v; want it answered once its pod came", a.err)
	}
	if got := a.resp.GetContainerResponses()[0].GetEnvs()[handoff.ClassEnv(class)]; got != gpu {
		t.Errorf("Allocate answered devices %q, want %s (envs %v)", got, gpu, a.resp.GetContainerResponses()[0].GetEnvs())
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
