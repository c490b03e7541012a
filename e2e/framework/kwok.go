package framework

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
)

// Simulated nodes are managed by kwok, which plays their kubelets: it keeps them
// Ready with leases and heartbeats and moves pods bound to them to Running. They
// carry this annotation and label.
const (
	SimulatedNodeAnnotation = "kwok.x-k8s.io/node"
	SimulatedNodeLabel      = "resclass.io/simulated"
)

// SimulatedPendingLabel on a pod keeps kwok from moving it to Running once it
// is bound to a simulated node (the build adds it to kwok's pod-ready stage):
// a scheduling benchmark's pods are bound and nothing more, as in upstream's
// scheduler_perf, so that no kubelet's work falls into what it measures.
const SimulatedPendingLabel = "resclass.io/simulated-pending"

// SimulatedNodes describes a batch of kwok nodes.
type SimulatedNodes struct {
	// Prefix names the nodes Prefix-0 ... Prefix-(Count-1).
	Prefix string
	Count  int
	// Profile, if set, names the simulated hardware (e2e/profiles) published as
	// each node's NodeDevices.
	Profile string
	Labels  map[string]string
	// Capacity adds to (or overrides) the nodes' capacity and allocatable, e.g.
	// a plain extended resource to compare against.
	Capacity corev1.ResourceList
	// GPUSharing, if it is a mode that shares (TimeSlicing, MPS), publishes
	// the profile's GPUs in that mode as the node agent does on a node
	// labelled for it (ShareGPUs), and labels the nodes so
	// (node.resclass.io/gpu-sharing). Empty (the default) or Exclusive: the
	// profile's devices as they are.
	GPUSharing v1alpha1.SharingMode
	// Classes adds, for each, class.resclass.io/<name> to the nodes' capacity
	// and allocatable as the node agent advertises it to the kubelet for the
	// published devices (ClassCapacity): a share class's slots on GPUs that
	// GPUSharing shares. Capacity overrides it.
	Classes []*v1alpha1.ResourceClass
}

// AddSimulatedNodes creates kwok nodes, publishes their NodeDevices and waits until
// all are Ready. It returns their names.
func (c *Cluster) AddSimulatedNodes(ctx context.Context, opts SimulatedNodes) ([]string, error) {
	if err := c.startKwok(ctx); err != nil {
		return nil, err
	}
	var devices *v1alpha1.NodeDevicesStatus
	if opts.Profile != "" {
		status, err := LoadProfile(opts.Profile)
		if err != nil {
			return nil, err
		}
		ShareGPUs(status.Devices, opts.GPUSharing)
		devices = &status
	}
	names := make([]string, opts.Count)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", opts.Prefix, i)
	}
	c.progress("creating %d simulated nodes %s-*", opts.Count, opts.Prefix)
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	if devices != nil {
		// The kubelet reports some devices as node capacity too (the pages
		// of a hugepage pool): the kinds say which.
		for name, q := range kinds.Builtin.NodeCapacity(devices.Devices) {
			sum := capacity[name]
			sum.Add(q)
			capacity[name] = sum
		}
	}
	for _, class := range opts.Classes {
		var n int64
		if devices != nil {
			var err error
			if n, err = ClassCapacity(class, devices.Devices); err != nil {
				return nil, err
			}
		}
		capacity[corev1.ResourceName(v1alpha1.ResourceNamePrefix+class.Name)] = *resource.NewQuantity(n, resource.DecimalSI)
	}
	for name, q := range opts.Capacity {
		capacity[name] = q
	}
	err := parallel(ctx, names, 16, func(ctx context.Context, name string) error {
		labels := map[string]string{SimulatedNodeLabel: "true", corev1.LabelHostname: name}
		if opts.GPUSharing.Shares() {
			labels[v1alpha1.LabelGPUSharing] = sharingLabel(opts.GPUSharing)
		}
		for k, v := range opts.Labels {
			labels[k] = v
		}
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: map[string]string{SimulatedNodeAnnotation: "fake"}},
			Status:     corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
		}
		created, err := c.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating node %s: %w", name, err)
		}
		if devices != nil {
			return c.publishNodeDevices(ctx, created, *devices)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	c.progress("created %d simulated nodes; waiting for kwok to make them Ready", opts.Count)
	// Each poll lists every simulated node: poll big batches less often, so the
	// wait does not compete with kwok and the apiserver for the CPU.
	interval := min(200*time.Millisecond+time.Duration(opts.Count)*time.Millisecond, 5*time.Second)
	// kwok initializes the nodes one by one, through an apiserver it shares the
	// machine with: a large batch takes longer (5000 nodes: minutes on 2 cores).
	timeout := max(300*time.Second, time.Duration(opts.Count)*150*time.Millisecond)
	err = wait.PollUntilContextTimeout(ctx, interval, timeout, true, func(ctx context.Context) (bool, error) {
		if err := c.alive("kwok"); err != nil {
			return false, err
		}
		// From the apiserver's watch cache (ResourceVersion "0"), not a quorum
		// read of every node from etcd.
		list, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: SimulatedNodeLabel + "=true", ResourceVersion: "0"})
		if err != nil {
			return false, nil
		}
		ready := map[string]bool{}
		for i := range list.Items {
			ready[list.Items[i].Name] = nodeReady(&list.Items[i]) && !hasNotReadyTaint(&list.Items[i])
		}
		for _, name := range names {
			if !ready[name] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("simulated nodes %s-* not ready: %w", opts.Prefix, err)
	}
	c.progress("%d simulated nodes ready", opts.Count)
	return names, nil
}

func (c *Cluster) startKwok(ctx context.Context) error {
	c.mu.Lock()
	started := c.kwokStarted
	c.kwokStarted = true
	c.mu.Unlock()
	if started {
		return nil
	}
	for _, f := range []string{c.bins.kwok, c.bins.kwokStages} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("simulated nodes need %s: run `make e2e-binaries`", f)
		}
	}
	c.progress("starting kwok for simulated nodes")
	_, err := c.start("kwok", c.bins.kwok, nil,
		// kwok plays many kubelets at once, so it acts as an admin rather than as
		// one system:node identity.
		"--kubeconfig="+c.Kubeconfig,
		"--config="+c.bins.kwokStages,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector="+SimulatedNodeAnnotation+"=fake",
		// A simulated node renews its Lease every quarter of this (kwok's
		// rule, as the kubelet's): 75 s, well inside the controller manager's
		// node-monitor grace period (5 minutes, startControllerManager), so
		// the nodes stay Ready. The kubelet's 40 s (a renewal every 10 s) cost
		// 100 Lease writes a second at 1000 nodes and 500 at 5000: most of
		// an idle cluster's CPU on two cores, taken from whatever a benchmark
		// measured (docs/scheduler.md, "An idle cluster").
		"--node-lease-duration-seconds=300",
		"--cidr=10.128.0.0/16",
	)
	if err != nil {
		return err
	}
	// kwok has no health endpoint unless it serves the kubelet API; its first
	// managed node becoming Ready is the proof that it works.
	return c.alive("kwok")
}

func hasNotReadyTaint(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable {
			return true
		}
	}
	return false
}

// parallel runs fn for every item with at most workers at once. The first error
// cancels the rest and is returned.
func parallel(ctx context.Context, items []string, workers int, fn func(context.Context, string) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := make(chan string)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for item := range work {
				if err := fn(ctx, item); err != nil {
					once.Do(func() { first = err; cancel() })
				}
			}
		}()
	}
	for _, item := range items {
		select {
		case work <- item:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	return first
}
