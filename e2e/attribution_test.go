package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// TestDeviceAttribution: issue 39's attribution metrics on a real kubelet
// with the node agent on the NVML mock and the resclass scheduler binary.
// Two pods hold a whole GPU each, two share one time-sliced GPU, one asks
// for more whole GPUs than the node has and stays Pending. The agent's
// resclass_node_agent_device_holder series name exactly the pods the
// assignments give each device (the shared GPU one series per pod), the
// scheduler's resclass_scheduler_class_devices are what `kubectl resclass
// capacity` prints, and class_pending_pods counts the Pending pod; once the
// pods are deleted the holder series are gone and held and pending are 0.
func TestDeviceAttribution(t *testing.T) {
	ctx, cancel := agentTest(t, 4*time.Minute)
	defer cancel()
	const nodeName = "attribution-node"
	const (
		whole = "e2e-attr-whole"
		share = "e2e-attr-10g" // 10Gi and 25%: 4 units of the mock's 40Gi GPUs
	)
	dgx, root := mockDGX(t)
	uuids := dgx.UUIDs()
	gpu := req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu")
	schedClass(t, ctx, whole, gpu)
	shareClass(t, ctx, share, "10Gi", 25, gpu)

	kn, err := cluster.AddKubeletNode(ctx, framework.NodeOptions{Name: nodeName})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNodes([]string{nodeName}) })
	// GPUs 0–3 time-sliced (shares only), 4–7 exclusive (whole only).
	labels := map[string]string{v1alpha1.LabelGPUSharing: v1alpha1.SharingLabelTimeSlicing}
	for _, id := range uuids[4:] {
		labels[v1alpha1.LabelGPUSharingDevicePrefix+id] = v1alpha1.SharingLabelExclusive
	}
	labelNode(t, ctx, nodeName, labels)

	arc, akc := agentClients(t, nodeName)
	agent := nodeagent.New(mockGPUAgent(kn, dgx, root, t.TempDir()), arc, akc)
	actx, stopAgent := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := agent.Run(actx); err != nil {
			t.Errorf("agent: %v", err)
		}
	}()
	t.Cleanup(func() { stopAgent(); <-done })
	waitClassAllocatable(t, ctx, "whole GPUs 4–7", nodeName, whole, 4)
	waitClassAllocatable(t, ctx, "slots of 10Gi shares on GPUs 0–3", nodeName, share, 16)

	ns := newNamespace(t, ctx, nil)
	holders := []string{"w1", "w2", "s1", "s2"}
	for _, name := range holders {
		class := whole
		if name[0] == 's' {
			class = share
		}
		if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, gpuPodOn(ns, name, resclassScheduler, nodeName, class, 1), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// 5 whole GPUs: more than the node has, Pending.
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, gpuPodOn(ns, "pending", resclassScheduler, nodeName, whole, 5), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// What the assignments say each device is held by, as holder series.
	want := map[string]bool{}
	perDevice := map[string]int{}
	for _, name := range holders {
		_, a := boundAssignment(t, ctx, ns, name)
		podRunning(t, ctx, ns, name) // the kubelet called Allocate
		for _, c := range a.Containers {
			for class, ids := range c.Classes {
				for _, id := range ids {
					want[holderSeries(class, id, ns, name)] = true
					perDevice[id]++
				}
			}
		}
	}
	if !slices.Contains(slices.Collect(maps.Values(perDevice)), 2) {
		t.Errorf("devices held %v: the two shares should be on one GPU", perDevice)
	}
	var got map[string]bool
	poll(t, ctx, time.Minute, "the agent's holder series to name the assigned pods", func(context.Context) (bool, error) {
		got = agentHolders(t, agent)
		return maps.Equal(got, want), nil
	})

	waitClassFigures(t, ctx, map[string]classFigures{
		whole: {allocatable: 4, held: 2, free: 2, pending: 1},
		share: {allocatable: 16, held: 2, free: 14, pending: 0},
	})

	for _, name := range append(holders, "pending") {
		if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptrTo(int64(0))}); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, ctx, time.Minute, "the agent's holder series to go with the pods", func(context.Context) (bool, error) {
		got = agentHolders(t, agent)
		return len(got) == 0, nil
	})
	waitClassFigures(t, ctx, map[string]classFigures{
		whole: {allocatable: 4, held: 0, free: 4, pending: 0},
		share: {allocatable: 16, held: 0, free: 16, pending: 0},
	})
}

func holderSeries(class, device, ns, pod string) string {
	return fmt.Sprintf("class=%s device=%s kind=%s namespace=%s pod=%s", class, device, v1alpha1.DeviceKindNvidiaGPU, ns, pod)
}

// agentHolders are the agent's resclass_node_agent_device_holder series with
// value 1, as holderSeries writes them.
func agentHolders(t *testing.T, agent *nodeagent.Agent) map[string]bool {
	t.Helper()
	families, err := agent.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, f := range families {
		if f.GetName() != "resclass_node_agent_device_holder" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if m.GetGauge().GetValue() != 1 || l["kind"] != v1alpha1.DeviceKindNvidiaGPU {
				t.Errorf("holder series %v = %v, want 1 and kind %s", l, m.GetGauge().GetValue(), v1alpha1.DeviceKindNvidiaGPU)
			}
			out[holderSeries(l["class"], l["device"], l["namespace"], l["pod"])] = true
		}
	}
	return out
}

type classFigures struct{ allocatable, held, free, pending int64 }

// waitClassFigures waits until the scheduler's class metrics are want for
// each class, and its device figures are what kubectl resclass capacity
// computes at the same time.
func waitClassFigures(t *testing.T, ctx context.Context, want map[string]classFigures) {
	t.Helper()
	var scraped, printed map[string]classFigures
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		samples, err := cluster.Metrics(ctx, "scheduler")
		if err != nil {
			return false, err
		}
		caps, err := resclassCapacity(ctx)
		if err != nil {
			return false, err
		}
		scraped, printed = map[string]classFigures{}, map[string]classFigures{}
		for class, w := range want {
			devices := samples.By("resclass_scheduler_class_devices", "state", "class="+class)
			scraped[class] = classFigures{allocatable: int64(devices["allocatable"]), held: int64(devices["held"]), free: int64(devices["free"]),
				pending: int64(samples.Sum("resclass_scheduler_class_pending_pods", "class="+class))}
			if i := slices.IndexFunc(caps, func(c classCapacity) bool { return c.Class == class }); i >= 0 {
				printed[class] = classFigures{allocatable: caps[i].Allocatable, held: caps[i].Held, free: caps[i].Free, pending: w.pending}
			}
		}
		return maps.Equal(scraped, want) && maps.Equal(printed, want), nil
	}); err != nil {
		t.Fatalf("class figures: scraped %+v, kubectl resclass capacity %+v, want %+v: %v", scraped, printed, want, err)
	}
}

// resclassCapacity runs `kubectl resclass capacity -o json` as the admin.
// The e2e binary does not import pkg/kubectlplugin: what it links imports
// Go's plugin package, which binds every symbol at load, and go-nvml's NVML
// is bound lazily (docs/development.md).
func resclassCapacity(ctx context.Context) ([]classCapacity, error) {
	root, err := framework.RepoRoot()
	if err != nil {
		return nil, err
	}
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(root, "_output", "bin", "kubectl-resclass"), "--kubeconfig="+cluster.Kubeconfig, "capacity", "-o", "json")
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("kubectl resclass capacity: %w: %s", err, errOut.String())
	}
	var caps []classCapacity
	return caps, json.Unmarshal(out.Bytes(), &caps)
}
