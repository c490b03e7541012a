package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	lib "github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/cdispec"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	"github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// TestNodeAgentKeepsGPUsThroughNVMLErrors: NVML fails mid-run on a node with
// a running GPU pod whose container keeps restarting (it exits at once, as a
// crashing trainer does). A failed NVML pass used to publish the node without
// GPUs, stop the class's endpoint and delete the CDI spec, so the restarted
// container named a CDI device that no longer resolved. Now, while NVML
// fails, the GPUs stay in NodeDevices and the node's allocatable, the
// condition says what is kept, the container restarts with its GPU's CDI name
// and the spec still names it; when NVML answers again, the condition clears.
func TestNodeAgentKeepsGPUsThroughNVMLErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	diagnoseOnFailure(t, cluster)
	const class, nodeName = "e2e-nvml-fault", "nvml-fault-node"
	dgx := nvmlmock.New()
	cdiDir := filepath.Join(t.TempDir(), "cdi")
	kn := agentGPUNode(t, ctx, nodeName, class, func(_ *framework.KubeletNode, c *nodeagent.Config) {
		c.Kinds = kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{Binding: dgx, Health: nvml.HealthOptions{WaitTimeout: 100 * time.Millisecond}}})
		c.CDISpecDir = cdiDir
		// NVML is asked every second, so the fault is seen at once.
		c.ResyncInterval, c.OpenRetryMax = time.Second, time.Second
		c.DeviceGracePeriod = 3 * time.Minute
	})

	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, ctx, nil)
	pod := gpuPodOn(ns, "trainer", resclassScheduler, nodeName, class, 1)
	pod.Spec.RestartPolicy = corev1.RestartPolicyAlways
	pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "RESCLASS_E2E_EXIT_CODE", Value: "1"}}
	if _, err := tenant(t, ctx, ns).CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// creations are the trainer container's creations since, with the CDI
	// devices each got.
	creations := func(since time.Time) [][]string {
		records, err := kn.Records()
		if err != nil {
			t.Fatal(err)
		}
		var out [][]string
		for _, r := range records {
			if r.Namespace != ns || r.Pod != "trainer" || r.Time.Before(since) {
				continue
			}
			var names []string
			for _, d := range r.CDIDevices {
				names = append(names, d.GetName())
			}
			out = append(out, names)
		}
		return out
	}
	var gpuName string
	poll(t, ctx, time.Minute, "the trainer's first container with a GPU", func(context.Context) (bool, error) {
		c := creations(time.Time{})
		if len(c) == 0 || len(c[0]) != 1 {
			return false, nil
		}
		gpuName = c[0][0]
		return true, nil
	})
	gpuID := strings.TrimPrefix(gpuName, cdispec.Kind+"=")
	t.Logf("the trainer's container got %s", gpuName)

	// NVML fails, the driver staying loaded.
	faultAt := time.Now()
	dgx.FailCount(lib.ERROR_UNKNOWN)
	var msg string
	poll(t, ctx, time.Minute, "NVMLAvailable=False saying the GPUs are kept", func(ctx context.Context) (bool, error) {
		nd, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		c := nvmlCondition(nd)
		if c == nil || c.Status != metav1.ConditionFalse {
			return false, nil
		}
		msg = c.Message
		if !strings.Contains(msg, "keeping the 8 devices last described (0 unhealthy)") {
			return false, fmt.Errorf("NVMLAvailable=False without the kept devices: %s", msg)
		}
		if nd.Status.Summary.GPUs != 8 {
			return false, fmt.Errorf("NodeDevices lists %d GPUs while NVML fails, want the 8 kept", nd.Status.Summary.GPUs)
		}
		return true, nil
	})
	t.Logf("while NVML fails: NVMLAvailable=False: %s", msg)

	// The container restarts during the fault, with the same GPU, and the
	// runtime can resolve it: the spec still names it.
	poll(t, ctx, 2*time.Minute, "the trainer's container restarted during the NVML fault", func(context.Context) (bool, error) {
		c := creations(faultAt)
		if len(c) == 0 {
			return false, nil
		}
		if len(c[0]) != 1 || c[0][0] != gpuName {
			return false, fmt.Errorf("restarted with CDI devices %v, want [%s]", c[0], gpuName)
		}
		return true, nil
	})
	spec, err := os.ReadFile(filepath.Join(cdiDir, cdispec.FileName))
	if err != nil {
		t.Fatalf("the CDI spec during the NVML fault: %v", err)
	}
	if !strings.Contains(string(spec), "name: "+gpuID) {
		t.Fatalf("the CDI spec during the NVML fault does not name %s:\n%s", gpuID, spec)
	}
	n, err := cluster.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if q := n.Status.Allocatable[corev1.ResourceName(v1alpha1.ResourceNamePrefix+class)]; q.Value() != 8 {
		t.Fatalf("allocatable %s during the NVML fault, want 8", q.String())
	}
	if nd, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, nodeName, metav1.GetOptions{}); err != nil || !strings.Contains(nvmlCondition(nd).Message, "keeping the 8 devices") {
		t.Fatalf("NVML still fails, the GPUs must still be kept: %v %+v", err, nd)
	}

	// NVML answers again.
	dgx.FailCount(lib.SUCCESS)
	poll(t, ctx, time.Minute, "NVMLAvailable=True again", func(ctx context.Context) (bool, error) {
		nd, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		c := nvmlCondition(nd)
		return c != nil && c.Status == metav1.ConditionTrue && c.Message == "8 GPUs" && nd.Status.Summary.GPUs == 8, nil
	})
	if p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "trainer", metav1.GetOptions{}); err != nil || p.Status.Phase == corev1.PodFailed {
		t.Fatalf("the trainer after the fault: %v, phase %s", err, p.Status.Phase)
	}
}
