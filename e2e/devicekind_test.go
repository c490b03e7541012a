package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/e2e/testkind"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// TestDeviceKindSeam adds a device kind that no package of resclass knows
// (e2e/testkind, an FPGA read from a sysfs-like directory) with one
// registration line, and follows it through every part on the real cluster:
// the node agent discovers it and publishes it with its condition and label,
// the real scheduler places a pod of a class selecting it by its attribute,
// and the real kubelet hands the chosen device to the container with the
// kind's environment and device node.
func TestDeviceKindSeam(t *testing.T) {
	ctx, cancel := agentTest(t, 3*time.Minute)
	defer cancel()
	const class = "e2e-big-fpga"
	schedClass(t, ctx, class,
		v1alpha1.ResourceSelectorRequirement{Key: "kind", Operator: v1alpha1.ResourceSelectorOpIn, Values: []string{testkind.Name}},
		v1alpha1.ResourceSelectorRequirement{Key: testkind.AttributeCells, Operator: v1alpha1.ResourceSelectorOpGtEq, Values: []string{"1000"}})

	const nodeName = "fpga-node"
	kn, err := cluster.AddKubeletNode(ctx, framework.NodeOptions{Name: nodeName})
	if err != nil {
		t.Fatal(err)
	}
	// Two FPGAs: a small one the class does not select, and a big one.
	root := t.TempDir()
	for name, files := range map[string]map[string]string{
		"small": {"cells": "500", "minor": "0"},
		"big":   {"cells": "2000", "minor": "1"},
	} {
		dir := filepath.Join(root, testkind.Dir, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f, v := range files {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(v+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, dev := range []string{"dev/e2e-fpga0", "dev/e2e-fpga1"} {
		e2eMknod(t, root, "/"+dev, 1, 3) // like /dev/null: a device node the runtime could open
	}

	arc, akc := agentClients(t, nodeName)
	actx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	wg.Go(func() {
		agent := nodeagent.New(nodeagent.Config{
			NodeName: nodeName, HostRoot: root,
			PollInterval: 200 * time.Millisecond, ResyncInterval: time.Minute,
			PluginDir: kn.PluginDir(), WaitForPod: 2 * time.Second,
			// The default device-list strategy (cdi-cri) keeps a CDI spec of
			// the node's GPUs (none here): here, not the host's /var/run/cdi.
			CDISpecDir: filepath.Join(t.TempDir(), "cdi"),
			// No NVML on this node, whatever the machine has; and the one
			// registration line.
			Kinds: kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{Binding: lib.New(lib.WithLibraryPath("/nonexistent/libnvidia-ml.so.1"))}}).
				With(testkind.Kind{}),
		}, arc, akc)
		if err := agent.Run(actx); err != nil {
			t.Errorf("agent: %v", err)
		}
	})

	// Discovered: published with the kind's condition, typed attribute and label.
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, time.Minute, "the FPGAs published and the node labelled", func(ctx context.Context) (bool, error) {
		nd, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(nd.Status.Conditions, testkind.Condition)
		var ids []string
		for _, d := range nd.Status.Devices {
			if d.Kind == testkind.Name && d.Healthy && d.Attributes[testkind.AttributeCells].IntValue != nil {
				ids = append(ids, d.ID)
			}
		}
		return c != nil && c.Status == metav1.ConditionTrue && c.Message == "2 FPGAs" &&
			slices.Equal(ids, []string{"fpga-big", "fpga-small"}) && n.Labels[testkind.LabelCount] == "2", nil
	})

	// Scheduled by the real scheduler, which knows nothing of the kind, and
	// handed off by the real kubelet through the agent's endpoint.
	ns := newNamespace(t, ctx, nil)
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, gpuPodOn(ns, "fpga", resclassScheduler, nodeName, class, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, a := boundAssignment(t, ctx, ns, "fpga")
	if got := a.Containers[0].Classes[class]; !slices.Equal(got, []string{"fpga-big"}) {
		t.Fatalf("the scheduler assigned %v of class %s, want the big FPGA only", got, class)
	}
	rec := waitRecord(t, ctx, kn, ns, "fpga", "c")
	if rec.Env[testkind.EnvVisible] != "fpga-big" || rec.Env[handoff.ClassEnv(class)] != "fpga-big" {
		t.Errorf("env %v, want %s and %s naming fpga-big", rec.Env, testkind.EnvVisible, handoff.ClassEnv(class))
	}
	var nodes []string
	for _, d := range rec.Devices {
		nodes = append(nodes, d.HostPath)
	}
	if !slices.Equal(nodes, []string{"/dev/e2e-fpga1"}) {
		t.Errorf("device nodes %v, want the big FPGA's /dev/e2e-fpga1 only", nodes)
	}
}
