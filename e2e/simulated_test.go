package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resclass/resclass/e2e/framework"
)

// TestSimulatedNodes: kwok nodes become Ready with the NodeDevices of their
// profile, take pods from the resclass scheduler, and a deleted node's NodeDevices
// is garbage-collected through its ownerReference.
func TestSimulatedNodes(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	const count = 50
	names, err := cluster.AddSimulatedNodes(ctx, framework.SimulatedNodes{Prefix: "sim-dgx", Count: count, Profile: "dgx-a100"})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	nd, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, names[7], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if nd.Status.Summary.GPUs != 8 || len(nd.Status.Devices) != 12 {
		t.Errorf("NodeDevices %s: %d GPUs, %d devices; want the dgx-a100 profile's 8 and 12", names[7], nd.Status.Summary.GPUs, len(nd.Status.Devices))
	}

	ns := newNamespace(t, ctx, nil)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "on-simulated", Namespace: ns},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{framework.SimulatedNodeLabel: "true"},
			Containers:   []corev1.Container{{Name: "main", Image: "registry.example/app:1"}},
		},
	}
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, 60*time.Second, "pod running on a simulated node", func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.Status.Phase == corev1.PodRunning && strings.HasPrefix(p.Spec.NodeName, "sim-dgx-"), nil
	})

	if err := cluster.Client.CoreV1().Nodes().Delete(ctx, names[0], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, 60*time.Second, "NodeDevices of the deleted node garbage-collected", func(ctx context.Context) (bool, error) {
		_, err := rc.ResclassV1alpha1().NodeDevices().Get(ctx, names[0], metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}
