package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// operatorQuestions runs kubectl resclass (the built plugin) as an operator
// would, with the cluster's kubeconfig: capacity, why a pod is Pending,
// explain, and preview of a class not yet created.
func operatorQuestions(ctx context.Context, p *printer, c *framework.Cluster, root string) error {
	bin := filepath.Join(root, "_output", "bin", "kubectl-resclass")
	run := func(args ...string) error {
		p.line("  $ kubectl resclass %s", strings.Join(args, " "))
		cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig=" + c.Kubeconfig}, args...)...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		for _, l := range strings.Split(strings.TrimRight(out.String(), "\n"), "\n") {
			p.line("    %s", l)
		}
		if err != nil {
			return fmt.Errorf("kubectl resclass %s: %w", strings.Join(args, " "), err)
		}
		return nil
	}
	p.line("  kubectl-resclass is a kubectl plugin (make build puts it in bin/; copy it onto the")
	p.line("  PATH). It runs the scheduler plugin's own decision code over what the cluster")
	p.line("  publishes, and needs only read rights (the view ClusterRole, bound cluster-wide).")
	p.line("")
	p.line("  Every class: devices allocatable, held by pods, free for a new pod:")
	if err := run("capacity"); err != nil {
		return err
	}

	p.line("")
	p.line("  demo/train-big asks for 16 GPUs of nvidia.high.mem; no node has that many:")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "train-big", Namespace: "demo"},
		Spec: corev1.PodSpec{SchedulerName: "resclass-scheduler", RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "train", Image: "registry.example/train:1",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNamePrefix + "nvidia.high.mem": resource.MustParse("16")}}}}},
	}
	if _, err := c.Client.CoreV1().Pods("demo").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return err
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		evs, err := c.Client.CoreV1().Events("demo").List(ctx, metav1.ListOptions{FieldSelector: fields.Set{"involvedObject.name": "train-big", "reason": "FailedScheduling"}.String()})
		return err == nil && len(evs.Items) > 0, err
	})
	if err != nil {
		return fmt.Errorf("no FailedScheduling Event on demo/train-big: %w", err)
	}
	if err := run("why-pending", "train-big", "-n", "demo"); err != nil {
		return err
	}

	p.line("")
	p.line("  Per node, what a class selects, and why not the rest (selector.Explain's words):")
	if err := run("explain", "inference.gpu", "--node", "t4-inference"); err != nil {
		return err
	}

	p.line("")
	p.line("  A class not yet created, previewed before kubectl apply:")
	dir, err := os.MkdirTemp("", "resclass-demo-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	file := filepath.Join(dir, "fast-nics.yaml")
	class := `apiVersion: resclass.io/v1alpha1
kind: ResourceClass
metadata:
  name: nic.200g
spec:
  resourceSelector:
    - matchExpressions:
        - {key: kind, operator: In, values: [nic]}
        - {key: speed, operator: GtEq, values: [200Gbps]}
`
	if err := os.WriteFile(file, []byte(class), 0o644); err != nil {
		return err
	}
	for _, l := range strings.Split(strings.TrimRight(class, "\n"), "\n") {
		p.line("    %s", l)
	}
	return run("preview", "-f", file, "--node", "nic-gateway")
}
