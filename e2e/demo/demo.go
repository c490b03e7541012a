package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/selector"
)

// demoNodes are the kubelet nodes of the demo, one per simulated hardware profile.
var demoNodes = []string{"dgx-a100", "nic-gateway", "t4-inference"}

// node is a node's published inventory, prepared for matching.
type node struct {
	name    string
	devices []*selector.Device
}

type class struct {
	name     string
	compiled *selector.Class
}

// options of a demo run.
type options struct {
	root string // the repository
	keep bool   // leave the cluster running until interrupted
}

// run starts the embedded cluster, walks through resclass's scenarios on it and
// writes what happens to w.
func run(ctx context.Context, w io.Writer, opts options) (err error) {
	p := &printer{w: w}
	p.section("resclass demo: an embedded cluster of real Kubernetes parts")
	p.line("etcd, kube-apiserver, kube-controller-manager and kubelets of Kubernetes %s, with the", kubernetesVersion())
	p.line("resclass scheduler. Each kubelet node runs in a mount namespace of its own with a")
	p.line("recording container runtime (it records what the kubelet asks and runs nothing); every")
	p.line("device is simulated.")
	cluster, err := framework.Start(ctx, framework.Options{
		Scheduler: true,
		Progress:  func(format string, args ...any) { p.line("  . "+format, args...) },
	})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			p.line("\n%s", cluster.Diagnostics())
		}
		if stopErr := cluster.Stop(); stopErr != nil && err == nil {
			err = stopErr
		}
	}()
	for _, name := range demoNodes {
		if _, err := cluster.AddKubeletNode(ctx, framework.NodeOptions{
			Name: name, Profile: name,
			Labels: map[string]string{"resclass.io/profile": name},
		}); err != nil {
			return err
		}
	}
	if _, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}}, metav1.CreateOptions{}); err != nil {
		return err
	}

	p.section("1. Nodes and their devices (kubectl get nodedevices)")
	p.line("  These three nodes' NodeDevices are the demo harness's: it publishes them from simulated")
	p.line("  machines (e2e/profiles), as a node agent would. Sections 7 and 12 run the real node agent.")
	if err := printTable(ctx, p, cluster, "/apis/resclass.io/v1alpha1/nodedevices"); err != nil {
		return err
	}

	p.section("2. Resource classes, created through the apiserver (kubectl get resourceclasses)")
	if err := createClasses(ctx, p, cluster, filepath.Join(opts.root, "deploy/examples/resourceclasses.yaml")); err != nil {
		return err
	}
	if err := printTable(ctx, p, cluster, "/apis/resclass.io/v1alpha1/resourceclasses"); err != nil {
		return err
	}
	p.line("  (the scheduler writes allocatable, requested and available a second after a change; they are shown once pods hold devices, below)")

	classes, err := loadClasses(filepath.Join(opts.root, "deploy/examples/resourceclasses.yaml"))
	if err != nil {
		return err
	}
	nodes, err := readNodes(ctx, cluster)
	if err != nil {
		return err
	}
	p.section("3. Which devices each class selects (healthy / all), from the NodeDevices in the cluster")
	if err := selectionTable(p, classes, nodes); err != nil {
		return err
	}

	p.section("4. Why a device is not selected")
	t4 := findDevice(nodes, "t4-inference", v1alpha1.DeviceKindNvidiaGPU)
	for _, name := range []string{"nvidia.high.mem", "inference.gpu"} {
		c := findClass(classes, name)
		ok, why := c.compiled.Explain(t4)
		p.line("  %s on a Tesla T4 (%s): selected=%v", name, t4.ID, ok)
		for _, reason := range why {
			p.line("    %s", reason)
		}
	}

	p.section("5. A class with mistakes is refused by the webhook, with the fields to fix")
	wh, err := startWebhook(ctx, p, cluster, opts.root)
	if err != nil {
		return err
	}
	defer func() { _ = wh.Stop(context.Background()) }()
	if err := badClass(ctx, p, cluster); err != nil {
		return err
	}

	p.section("6. The hand-off: the devices the scheduler chooses, written on the pod")
	if err := handOff(p, classes, nodes); err != nil {
		return err
	}

	p.section("7. The node agent hands the assigned devices to the container")
	agentKubelet, dgx, stopAgent, err := startNodeAgent(ctx, cluster, opts.root)
	if err != nil {
		return err
	}
	gpus := dgx.UUIDs()
	defer stopAgent()
	if err := agentHandOff(ctx, p, cluster, agentKubelet, gpus); err != nil {
		return err
	}

	p.section("8. The affinity policy and the critical-pods quota, enforced by the webhook beside the apiserver's quota")
	if err := policyPods(ctx, p, cluster); err != nil {
		return err
	}

	p.section("9. One ConfigMap or Secret, kept in many namespaces (ResourceDistribution)")
	ctl, err := startDistribution(ctx, p, cluster)
	if err != nil {
		return err
	}
	defer func() { _ = ctl.Stop() }()
	if err := distribute(ctx, p, cluster); err != nil {
		return err
	}

	p.section("10. kubectl resclass: the questions an operator asks")
	if err := operatorQuestions(ctx, p, cluster, opts.root); err != nil {
		return err
	}

	p.section("11. One GPU shared by pods of different sizes, each with its own share")
	if err := sharedGPU(ctx, p, cluster, agentKubelet, gpus); err != nil {
		return err
	}

	p.section("12. MIG slices made for pods, on demand")
	if err := migOnDemand(ctx, p, cluster, agentKubelet, dgx); err != nil {
		return err
	}

	p.section("13. A DRA-mode node: the same class, and MIG slices, through Dynamic Resource Allocation")
	dra, err := startDRANode(ctx, cluster)
	if err != nil {
		return err
	}
	defer dra.stop()
	if err := draNodeSection(ctx, p, cluster, dra); err != nil {
		return err
	}
	if err := draMIG(ctx, p, cluster, dra); err != nil {
		return err
	}

	p.section("Done")
	if opts.keep {
		p.line("The cluster stays up until you press Ctrl-C. Try:")
		p.line("  export KUBECONFIG=%s", cluster.Kubeconfig)
		p.line("  kubectl get nodes,nodedevices,resourceclasses")
		p.line("  kubectl get nodedevices dgx-a100 -o yaml")
		p.line("  kubectl -n demo get pods -o wide")
		p.line("  kubectl -n demo describe pod train-3")
		p.line("  kubectl get resourcedistributions; kubectl -n web get configmap ml-settings -o yaml")
		p.line("  export PATH=%s:$PATH   # kubectl-resclass, the plugin", filepath.Join(opts.root, "_output", "bin"))
		p.line("  kubectl resclass capacity --nodes; kubectl resclass why-pending train-big -n demo")
		p.line("  kubectl get nodedevices %s -o yaml   # a GPU's sharing; kubectl label node %s %s=mps", agentNode, agentNode, v1alpha1.LabelGPUSharing)
		p.line("  kubectl resclass mig; kubectl -n demo get pod infer-10g -o yaml   # a MIG slice made for a pod")
		p.line("  kubectl get deviceclass %s -o yaml; kubectl get resourceslices; kubectl -n demo get resourceclaims", draClass)
		p.line("  kubectl get resourceslices -o yaml | grep -B2 -A8 sharedCounters   # a dynamic MIG GPU's counters on %s", draNode)
		if p.err != nil {
			return p.err
		}
		<-ctx.Done()
		p.line("stopping the cluster")
	} else {
		p.line("Run `DEMO_KEEP=1 make demo` to keep the cluster up and explore it with kubectl.")
	}
	return p.err
}

func kubernetesVersion() string {
	root, err := framework.RepoRoot()
	if err != nil {
		return "(unknown)"
	}
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "(unknown)"
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "k8s.io/kubernetes" {
			return f[1]
		}
	}
	return "(unknown)"
}

// printTable prints a list the way kubectl does: as the server's Table, whose
// columns for our kinds come from the CRDs' printer columns.
func printTable(ctx context.Context, p *printer, c *framework.Cluster, path string) error {
	raw, err := c.Client.Discovery().RESTClient().Get().AbsPath(path).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	var table metav1.Table
	if err := json.Unmarshal(raw, &table); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	out := &printer{w: tw}
	var keep []int
	var header []string
	for i, col := range table.ColumnDefinitions {
		if col.Priority == 0 && col.Name != "Age" { // as kubectl without -o wide; ages differ per run
			keep = append(keep, i)
			header = append(header, strings.ToUpper(col.Name))
		}
	}
	out.line("  %s", strings.Join(header, "\t"))
	for _, row := range table.Rows {
		var cells []string
		for _, i := range keep {
			cell := fmt.Sprint(row.Cells[i])
			if row.Cells[i] == nil {
				cell = "<none>"
			}
			cells = append(cells, cell)
		}
		out.line("  %s", strings.Join(cells, "\t"))
	}
	return errors.Join(out.err, tw.Flush())
}

// createClasses creates the example classes, then shows the apiserver refusing a
// broken class and a change to a class, by the CRD's own validation rules.
func createClasses(ctx context.Context, p *printer, c *framework.Cluster, path string) error {
	rc, err := c.Resclass()
	if err != nil {
		return err
	}
	docs, err := readYAMLDocuments(path)
	if err != nil {
		return err
	}
	for _, doc := range docs {
		var obj v1alpha1.ResourceClass
		if err := yaml.UnmarshalStrict(doc, &obj); err != nil {
			return err
		}
		if _, err := rc.ResclassV1alpha1().ResourceClasses().Create(ctx, &obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating ResourceClass %s: %w", obj.Name, err)
		}
	}
	broken := &v1alpha1.ResourceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "broken"},
		Spec: v1alpha1.ResourceClassSpec{ResourceSelector: []v1alpha1.ResourcePropertySelector{{MatchExpressions: []v1alpha1.ResourceSelectorRequirement{
			{Key: "memory", Operator: v1alpha1.ResourceSelectorOpGtEq, Values: []string{"30G", "40G"}},
		}}}},
	}
	_, err = rc.ResclassV1alpha1().ResourceClasses().Create(ctx, broken, metav1.CreateOptions{})
	if err == nil {
		return errors.New("the apiserver accepted a class with two values for GtEq")
	}
	p.line("  memory GtEq [30G, 40G] is refused by the apiserver:")
	p.line("    %v", err)

	current, err := rc.ResclassV1alpha1().ResourceClasses().Get(ctx, "fast.nic", metav1.GetOptions{})
	if err != nil {
		return err
	}
	current.Spec.ResourceSelector[0].MatchExpressions[1].Values = []string{"10Gbps"}
	_, err = rc.ResclassV1alpha1().ResourceClasses().Update(ctx, current, metav1.UpdateOptions{})
	if err == nil {
		return errors.New("the apiserver accepted a change to a class's spec")
	}
	p.line("  so is lowering fast.nic to 10Gbps in place:")
	p.line("    %v", err)
	return nil
}

// readNodes reads every NodeDevices back from the cluster.
func readNodes(ctx context.Context, c *framework.Cluster) ([]node, error) {
	rc, err := c.Resclass()
	if err != nil {
		return nil, err
	}
	list, err := rc.ResclassV1alpha1().NodeDevices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []node
	for _, nd := range list.Items {
		n := node{name: nd.Name}
		for i := range nd.Status.Devices {
			d := selector.NewDevice(&nd.Status.Devices[i])
			if problems := d.Problems(); len(problems) > 0 {
				return nil, fmt.Errorf("NodeDevices %s, device %s: %v", nd.Name, d.ID, problems)
			}
			n.devices = append(n.devices, d)
		}
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b node) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

func selectionTable(p *printer, classes []class, nodes []node) error {
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	table := &printer{w: tw}
	var names []string
	for _, n := range nodes {
		names = append(names, n.name)
	}
	table.line("  CLASS\t%s\tCLUSTER", strings.Join(names, "\t"))
	for _, c := range classes {
		row := []string{c.name}
		total, healthy := 0, 0
		for _, n := range nodes {
			h, a := 0, 0
			for _, d := range n.devices {
				if c.compiled.Matches(d) {
					a++
					if d.Healthy {
						h++
					}
				}
			}
			total, healthy = total+a, healthy+h
			row = append(row, fmt.Sprintf("%d/%d", h, a))
		}
		row = append(row, fmt.Sprintf("%d/%d", healthy, total))
		table.line("  %s", strings.Join(row, "\t"))
	}
	return errors.Join(table.err, tw.Flush())
}

// handOff shows the assignment annotations for a pod on dgx-a100, picked first-fit.
func handOff(p *printer, classes []class, nodes []node) error {
	p.line("  Pod train-1 on dgx-a100: container \"train\" requests class.resclass.io/nvidia.high.mem: 2")
	p.line("  and class.resclass.io/fast.nic: 1; init container \"stage\" requests hugepages-1gig: 1.")
	p.line("  Picked first-fit here to show the format; in section 7 the scheduler chooses.")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "train-1", Namespace: "demo"}}
	dgx := findNode(nodes, "dgx-a100")
	taken := map[string]bool{}
	pick := func(className string, n int) ([]string, error) {
		c := findClass(classes, className)
		var ids []string
		for _, d := range dgx.devices {
			if len(ids) < n && d.Healthy && !taken[d.ID] && c.compiled.Matches(d) {
				ids, taken[d.ID] = append(ids, d.ID), true
			}
		}
		if len(ids) < n {
			return nil, fmt.Errorf("dgx-a100 has %d free devices of class %s, need %d", len(ids), className, n)
		}
		return ids, nil
	}
	a := &assignment.Assignment{Node: dgx.name}
	for _, req := range []struct {
		container string
		init      bool
		class     string
		n         int
	}{{"stage", true, "hugepages-1gig", 1}, {"train", false, "nvidia.high.mem", 2}, {"train", false, "fast.nic", 1}} {
		ids, err := pick(req.class, req.n)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(a.Containers, func(c assignment.Container) bool { return c.Name == req.container })
		if i < 0 {
			a.Containers = append(a.Containers, assignment.Container{Name: req.container, Init: req.init, Classes: map[string][]string{}})
			i = len(a.Containers) - 1
		}
		a.Containers[i].Classes[req.class] = ids
	}
	annotations, err := assignment.Annotations(a)
	if err != nil {
		return err
	}
	pod.Annotations = annotations
	for _, k := range slices.Sorted(maps.Keys(annotations)) {
		p.line("    %s: %s", k, annotations[k])
	}
	back, found, err := assignment.FromPod(pod)
	if err != nil || !found {
		return fmt.Errorf("reading the assignment back: found=%v: %w", found, err)
	}
	p.line("  The node agent reads it back: container \"train\" gets nvidia.high.mem %v", back.Devices("train", "nvidia.high.mem"))

	pod.Annotations[assignment.AnnotationKey] = `{"node":"dgx-a100","containers":[{"name":"train","classes":{"nvidia.high.mem":["GPU-x","GPU-x"]}}]}`
	_, _, err = assignment.FromPod(pod)
	p.line("  A corrupt assignment is refused, never guessed at:")
	p.line("    %v", err)
	if err == nil {
		return errors.New("a corrupt assignment was accepted")
	}
	return nil
}

func loadClasses(path string) ([]class, error) {
	docs, err := readYAMLDocuments(path)
	if err != nil {
		return nil, err
	}
	var out []class
	for i, doc := range docs {
		var rc v1alpha1.ResourceClass
		if err := yaml.UnmarshalStrict(doc, &rc); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		c, errs := selector.Compile(&rc.Spec, field.NewPath("spec"))
		if len(errs) > 0 {
			return nil, fmt.Errorf("%s: ResourceClass %s: %w", path, rc.Name, errs.ToAggregate())
		}
		out = append(out, class{name: rc.Name, compiled: c})
	}
	return out, nil
}

func readYAMLDocuments(path string) ([][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if !isOnlyComments(doc) {
			docs = append(docs, doc)
		}
	}
}

func isOnlyComments(doc []byte) bool {
	for line := range strings.SplitSeq(string(doc), "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

func findNode(nodes []node, name string) *node {
	for i := range nodes {
		if nodes[i].name == name {
			return &nodes[i]
		}
	}
	panic("no node " + name)
}

func findClass(classes []class, name string) class {
	for _, c := range classes {
		if c.name == name {
			return c
		}
	}
	panic("no class " + name)
}

func findDevice(nodes []node, nodeName, kind string) *selector.Device {
	for _, d := range findNode(nodes, nodeName).devices {
		if d.Kind == kind {
			return d
		}
	}
	panic("no " + kind + " on " + nodeName)
}

// printer writes lines and keeps the first write error, so the walk-through reads
// as a script and fails once, at the end, if the output went nowhere.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) section(title string) { p.line("\n== %s", title) }

func (p *printer) line(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format+"\n", args...)
	}
}
