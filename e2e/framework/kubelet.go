package framework

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/resclass/resclass/e2e/framework/cri"
	"github.com/resclass/resclass/e2e/framework/exampleplugin"
	"github.com/resclass/resclass/e2e/framework/node"
)

// NodeOptions describe a kubelet node.
type NodeOptions struct {
	Name   string
	Labels map[string]string
	// ExampleDevices, if positive, runs the example device plugin with this many
	// devices of exampleplugin.ResourceName on the node.
	ExampleDevices int
	// Profile, if set, names the simulated hardware (e2e/profiles) whose
	// NodeDevices the harness publishes for the node, as its node agent will.
	Profile string
	// Agent, if set, is a node agent's command line, run in the node's mount
	// namespace (see node.Config.Agent).
	Agent []string
}

// KubeletNode is a real kubelet with the recording runtime, in its own mount
// namespace.
type KubeletNode struct {
	Name string
	Dir  string
	proc *process
}

// AddKubeletNode starts a kubelet node and waits until it is Ready (and, with
// example devices, advertises them).
func (c *Cluster) AddKubeletNode(ctx context.Context, opts NodeOptions) (*KubeletNode, error) {
	dir := filepath.Join(c.Dir, "nodes", opts.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// The kubelet authenticates as system:node:<name>, so the Node authorizer and
	// NodeRestriction admission limit it as on a real cluster.
	kubeconfig, err := c.componentKubeconfig("node-"+opts.Name, "system:node:"+opts.Name, []string{"system:nodes"})
	if err != nil {
		return nil, err
	}
	kubeletPort, err := freePort()
	if err != nil {
		return nil, err
	}
	healthzPort, err := freePort()
	if err != nil {
		return nil, err
	}
	var labels []string
	for k, v := range opts.Labels {
		labels = append(labels, k+"="+v)
	}
	args := []string{
		"--dir=" + dir, "--name=" + opts.Name, "--kubeconfig=" + kubeconfig,
		"--kubelet=" + c.bins.kubelet,
		"--kubelet-port=" + strconv.Itoa(kubeletPort), "--healthz-port=" + strconv.Itoa(healthzPort),
		"--client-ca-file=" + c.pki.CAFile,
		"--labels=" + strings.Join(labels, ","),
		"--example-devices=" + strconv.Itoa(opts.ExampleDevices),
		"--",
	}
	c.progress("starting kubelet node %s", opts.Name)
	// A mount namespace of its own: see package node.
	p, err := c.start("node-"+opts.Name, c.bins.node, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}, append(args, opts.Agent...)...)
	if err != nil {
		return nil, err
	}
	n := &KubeletNode{Name: opts.Name, Dir: dir, proc: p}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		if done, err := p.exited(); done {
			return false, fmt.Errorf("node %s exited: %w\n%s\nkubelet log:\n%s", opts.Name, err, p.tail(10), tailFile(filepath.Join(dir, node.KubeletLog), 20))
		}
		got, err := c.Client.CoreV1().Nodes().Get(ctx, opts.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if !nodeReady(got) {
			return false, nil
		}
		if opts.ExampleDevices > 0 {
			q := got.Status.Allocatable[exampleplugin.ResourceName]
			return q.Value() == int64(opts.ExampleDevices), nil
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("node %s not ready: %w\nkubelet log:\n%s", opts.Name, err, tailFile(filepath.Join(dir, node.KubeletLog), 30))
	}
	if opts.Profile != "" {
		status, err := LoadProfile(opts.Profile)
		if err != nil {
			return nil, err
		}
		if err := c.PublishNodeDevices(ctx, opts.Name, status); err != nil {
			return nil, err
		}
	}
	c.progress("node %s ready", opts.Name)
	return n, nil
}

// Records returns the CreateContainer requests the node's runtime received.
func (n *KubeletNode) Records() ([]cri.Record, error) {
	return cri.ReadRecords(filepath.Join(n.Dir, node.RecordsFile))
}

// Pid is the process id of the node's launcher, whose mount namespace the kubelet
// and the node's device plugins share.
func (n *KubeletNode) Pid() int { return n.proc.cmd.Process.Pid }

// PluginDir is the kubelet's device-plugin directory as this process reaches
// it: through /proc/<pid>/root, into the node's mount namespace. A device
// plugin serving its socket there is dialled by the kubelet at
// /var/lib/kubelet/device-plugins inside the node, the same file.
func (n *KubeletNode) PluginDir() string {
	return fmt.Sprintf("/proc/%d/root%s", n.Pid(), node.DevicePluginDir)
}

// PodResourcesSocket is the kubelet's PodResources API socket (its root
// directory is in the node's directory, which this process reaches as is).
func (n *KubeletNode) PodResourcesSocket() string {
	return filepath.Join(n.Dir, "root", "pod-resources", "kubelet.sock")
}

// RestartKubelet stops the node's kubelet and starts a new one, which wipes the
// device-plugin directory as a kubelet restart does on a real node. It returns
// once the new kubelet serves its registration socket again.
func (n *KubeletNode) RestartKubelet(ctx context.Context) error {
	socket := filepath.Join(n.PluginDir(), "kubelet.sock")
	before, err := os.Stat(socket)
	if err != nil {
		return err
	}
	if err := n.proc.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		after, err := os.Stat(socket)
		return err == nil && (!os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime())), nil
	})
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func tailFile(path string, n int) string {
	return (&process{logPath: path}).tail(n)
}

// WaitForRecord waits up to a minute for the runtime's CreateContainer of
// container in pod (namespace "" matches any) and returns it.
func (n *KubeletNode) WaitForRecord(ctx context.Context, namespace, pod, container string) (cri.Record, error) {
	var found cri.Record
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		records, err := n.Records()
		if err != nil {
			return false, nil // the file appears with the first container
		}
		for _, r := range records {
			if (namespace == "" || r.Namespace == namespace) && r.Pod == pod && r.Container == container {
				found = r
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return cri.Record{}, fmt.Errorf("no container %s of pod %s reached %s's runtime: %w", container, pod, n.Name, err)
	}
	return found, nil
}

// StopKubeletNode stops the kubelet node called name, if the cluster runs
// one, and forgets it: a test that is done with its node gives back what
// the kubelet holds until the cluster stops otherwise. Each kubelet holds
// inotify instances (cAdvisor, its certificate and config watches), of which
// a user has 128 by default (fs.inotify.max_user_instances): one suite
// keeping every test's kubelet up ran out, and the next kubelet's cAdvisor
// did not start.
func (c *Cluster) StopKubeletNode(name string) error {
	c.mu.Lock()
	i := slices.IndexFunc(c.processes, func(p *process) bool { return p.name == "node-"+name })
	if i < 0 {
		c.mu.Unlock()
		return nil
	}
	p := c.processes[i]
	c.processes = slices.Delete(c.processes, i, i+1)
	c.mu.Unlock()
	return p.stop(20 * time.Second)
}
