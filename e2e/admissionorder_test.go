package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/e2e/framework/cri"
	"github.com/resclass/resclass/e2e/framework/exampleplugin"
	"github.com/resclass/resclass/e2e/framework/node"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// TestHandoffAdmissionOrder makes a real kubelet admit a newer pod while an
// older one, bound to the node after it, waits in the agent's cache only: the
// case in which the agent's guess of the admission order (oldest first) is
// wrong (docs/node-agent.md, "The admission order").
//
// The newer pod b-newer has an init container that requests a device of the
// example plugin, whose Allocate the test holds: the kubelet admits one pod at
// a time, so it stays inside b-newer's admission. Meanwhile the older pod
// a-older (created first, held back by a scheduling gate) is scheduled and
// bound; the kubelet will see it only after b-newer. When Allocate is
// released, the kubelet asks the agent for b-newer's GPU.
//
// Without the kubelet's PodResources API the agent hands b-newer the GPU the
// scheduler assigned to a-older, and a-older then gets b-newer's: the swap
// this test shows first. With the API, the agent asks the kubelet, which
// lists b-newer and not a-older, and each pod gets its own GPU.
func TestHandoffAdmissionOrder(t *testing.T) {
	for _, tc := range []struct {
		name         string
		podResources bool
	}{
		{"without the PodResources API, the pods swap GPUs", false},
		{"with the PodResources API, each pod gets its own", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			diagnoseOnFailure(t, cluster)
			class := "e2e-order-gpu-" + map[bool]string{false: "guess", true: "ask"}[tc.podResources]
			nodeName := "order-node-" + map[bool]string{false: "guess", true: "ask"}[tc.podResources]
			kn := agentGPUNode(t, ctx, nodeName, class, func(kn *framework.KubeletNode, c *nodeagent.Config) {
				if !tc.podResources {
					c.PodResourcesSocket = "" // agentGPUNode asks the kubelet, as the DaemonSet does
				}
			})
			t.Cleanup(func() {
				if t.Failed() {
					data, _ := os.ReadFile(filepath.Join(kn.Dir, node.KubeletLog))
					var lines []string
					for _, l := range strings.Split(string(data), "\n") {
						if strings.Contains(l, "b-newer") || strings.Contains(l, "a-older") {
							lines = append(lines, l)
						}
					}
					t.Logf("kubelet log about the pods:\n%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
				}
			})
			plugin, err := exampleplugin.Start(ctx, kn.PluginDir(), 2)
			if err != nil {
				t.Fatal(err)
			}
			defer plugin.Stop()
			poll(t, ctx, time.Minute, "the example devices in the node's allocatable", func(ctx context.Context) (bool, error) {
				n, err := cluster.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				q := n.Status.Allocatable[exampleplugin.ResourceName]
				return q.Value() == 2, nil
			})
			ns := newNamespace(t, ctx, nil)

			const gate = "e2e.resclass.io/later"
			older := gpuPodOn(ns, "a-older", resclassScheduler, nodeName, class, 1)
			older.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: gate}}
			if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, older, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			// Creation times have a resolution of a second: the newer pod
			// is newer by one.
			time.Sleep(1100 * time.Millisecond)
			hold := plugin.Hold()
			defer hold.Release()
			newer := gpuPodOn(ns, "b-newer", resclassScheduler, nodeName, class, 1)
			newer.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: "registry.example/setup:1", Env: []corev1.EnvVar{{Name: cri.EnvExitCode, Value: "0"}}, Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{exampleplugin.ResourceName: resource.MustParse("1")},
			}}}
			if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, newer, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			_, newerA := boundAssignment(t, ctx, ns, "b-newer")
			select {
			case <-hold.Waiting:
			case <-ctx.Done():
				t.Fatal("the kubelet never called the example plugin's Allocate for b-newer")
			}

			// The kubelet is inside b-newer's admission: a-older is
			// scheduled and bound now, and reaches the agent's cache.
			patch := fmt.Sprintf(`{"spec":{"schedulingGates":null},"metadata":{"resourceVersion":%q}}`, mustGet(t, ctx, ns, "a-older").ResourceVersion)
			if _, err := cluster.Client.CoreV1().Pods(ns).Patch(ctx, "a-older", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			_, olderA := boundAssignment(t, ctx, ns, "a-older")
			// The agent's informer sees a binding within milliseconds on
			// this cluster; two seconds leave a wide margin.
			time.Sleep(2 * time.Second)
			hold.Release()

			podRunning(t, ctx, ns, "b-newer")
			podRunning(t, ctx, ns, "a-older")
			gpus := map[string]string{}
			records, err := kn.Records()
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range records {
				if r.Namespace == ns && r.Container == "c" {
					// The class's variable: sent whatever the
					// device-list strategy (cdi-cri by default).
					gpus[r.Pod] = r.Env[handoff.ClassEnv(class)]
				}
			}
			olderGPU, newerGPU := olderA.Devices("c", class)[0], newerA.Devices("c", class)[0]
			t.Logf("assigned: a-older %s, b-newer %s; containers got: %v", olderGPU, newerGPU, gpus)
			if tc.podResources {
				if gpus["b-newer"] != newerGPU || gpus["a-older"] != olderGPU {
					t.Errorf("containers got %v, want a-older %s and b-newer %s as the scheduler assigned", gpus, olderGPU, newerGPU)
				}
				return
			}
			if gpus["b-newer"] != olderGPU || gpus["a-older"] != newerGPU {
				t.Errorf("containers got %v; without the kubelet's answer the agent's guess should have swapped them (b-newer %s, a-older %s): the scenario no longer reproduces the out-of-order admission", gpus, olderGPU, newerGPU)
			}
		})
	}
}

func mustGet(t *testing.T, ctx context.Context, ns, name string) *corev1.Pod {
	t.Helper()
	p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
