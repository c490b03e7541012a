package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	deploynodeagent "github.com/resclass/resclass/deploy/node-agent"
	deployscheduler "github.com/resclass/resclass/deploy/scheduler"
	"github.com/resclass/resclass/pkg/assignment"
)

// BenchmarkPodCreateAssignmentPolicy: pod creations per second through the
// real apiserver with every admission policy resclass binds to pod creates
// (the two assignment policies and resclass-gpu-isolation) bound (policy),
// against the same creations with their bindings removed
// (baseline-no-policy). The pods carry annotations and an environment but no
// resclass key and no device-selecting variable, as every ordinary pod: each
// policy evaluates its matchConditions for each (the creator is not the
// scheduler, the namespace is not allow-listed), and admits.
//
// Each run creates the pods with 16 writers on an unthrottled client; ns/op
// means nothing here and is suppressed. The ratio is pods/s with the policy
// over pods/s without. Beside it, the CPU the kube-apiserver spends per pod,
// where the policy's cost lands (it runs in the apiserver's process).
func BenchmarkPodCreateAssignmentPolicy(b *testing.B) {
	const pods = 2000
	ctx := context.Background()
	client := fastClient(b)
	apiserver, err := cluster.PID("kube-apiserver")
	if err != nil {
		b.Fatal(err)
	}
	bindings := cluster.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	// enforced tells whether the apiserver's policy cache has the bindings
	// of both kinds of policy: each refuses its dry-run create exactly then.
	enforced := func(ctx context.Context) (assignmentPolicy, gpuPolicy bool) {
		_, assignmentErr := client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "bench-probe", Annotations: map[string]string{assignment.AnnotationKey: "{}"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1"}}},
		}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		_, gpuErr := client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "bench-probe"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1",
				Env: []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}}}},
		}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(assignmentErr), apierrors.IsForbidden(gpuErr)
	}
	waitEnforced := func(want bool) {
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			a, g := enforced(ctx)
			return a == want && g == want, nil
		}); err != nil {
			b.Fatalf("the pod policies enforced=%v: %v", want, err)
		}
	}
	restore := func() {
		if _, err := cluster.ApplyManifestData(ctx, "deploy/scheduler/assignment-policy.yaml", deployscheduler.AssignmentPolicy); err != nil {
			b.Fatal(err)
		}
		if _, err := cluster.ApplyManifestData(ctx, "deploy/node-agent/gpu-isolation-policy.yaml", deploynodeagent.GPUIsolationPolicy); err != nil {
			b.Fatal(err)
		}
		waitEnforced(true)
	}
	b.Cleanup(restore)

	run := func(b *testing.B) {
		var podsPerSecond, apiserverCPU float64
		for b.Loop() {
			ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-"}}, metav1.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			before := cpuSeconds(b, apiserver)
			start := time.Now()
			createPods(b, ctx, client, pods, func(i int) *corev1.Pod {
				return &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%05d", i), Namespace: ns.Name,
						Labels:      map[string]string{"app": "bench"},
						Annotations: map[string]string{"example.com/owner": "team-a", "example.com/revision": "3"}},
					Spec: corev1.PodSpec{
						SchedulerName: "bench-no-such-scheduler",
						Containers: []corev1.Container{{Name: "main", Image: "registry.example/app:1",
							Env: []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}, {Name: "NVIDIA_DRIVER_CAPABILITIES", Value: "utility"}}}},
					},
				}
			})
			podsPerSecond = pods / time.Since(start).Seconds()
			apiserverCPU = (cpuSeconds(b, apiserver) - before) / pods * 1e6
			if b.Failed() {
				b.FailNow()
			}
			deleteNamespaceAndWait(b, ctx, ns.Name)
		}
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(podsPerSecond, "pods/s")
		b.ReportMetric(apiserverCPU, "apiserver-cpu-us/pod")
	}
	b.Run("baseline-no-policy", func(b *testing.B) {
		for _, name := range []string{"resclass-assignment-writers", "resclass-scheduler-pod-writes", "resclass-gpu-isolation"} {
			if err := bindings.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				b.Fatal(err)
			}
		}
		waitEnforced(false)
		run(b)
	})
	b.Run("policy", func(b *testing.B) {
		restore()
		run(b)
		// The figure means something only if the policies were in force
		// throughout. (The apiserver counts a policy's admissions only when
		// its evaluation failed, so the creates cannot be counted; its match
		// rules cover every pod create, and the creator is not the scheduler.)
		if a, g := enforced(ctx); !a || !g {
			b.Fatalf("the pod policies were not in force after the run")
		}
	})
}
