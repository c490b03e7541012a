package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/selector"
)

// node is a simulated node: its published inventory, prepared for matching.
type node struct {
	name    string
	devices []*selector.Device
}

type class struct {
	name     string
	compiled *selector.Class
}

// run walks through the scenarios of the resource-class proposal on the simulated
// nodes under root/e2e/profiles with the classes of root/deploy/examples, writing
// what happens to w.
func run(w io.Writer, root string) error {
	p := &printer{w: w}
	p.section("resclass demo")
	p.line("This stage of the demo runs resclass's own code — the selector engine and the")
	p.line("scheduler -> node-agent hand-off codec — on simulated node inventories. The")
	p.line("embedded cluster (real kube-apiserver, scheduler and kubelets) replaces it when it lands.")

	classes, err := loadClasses(filepath.Join(root, "deploy/examples/resourceclasses.yaml"))
	if err != nil {
		return err
	}
	nodes, err := loadNodes(filepath.Join(root, "e2e/profiles"))
	if err != nil {
		return err
	}

	p.section("1. Nodes (NodeDevices as the node agent publishes them)")
	for _, n := range nodes {
		kinds := map[string]int{}
		for _, d := range n.devices {
			kinds[d.Kind]++
		}
		p.line("  %-14s %s", n.name, countsString(kinds))
	}

	p.section("2. Which devices each class selects (healthy / all)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	table := &printer{w: tw}
	table.line("  CLASS\t%s\tCLUSTER", strings.Join(nodeNames(nodes), "\t"))
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
	if err := errors.Join(table.err, tw.Flush()); err != nil {
		return err
	}

	p.section("3. Why a device is not selected")
	t4 := findDevice(nodes, "t4-inference", v1alpha1.DeviceKindNvidiaGPU)
	for _, name := range []string{"nvidia.high.mem", "inference.gpu"} {
		c := findClass(classes, name)
		ok, why := c.compiled.Explain(t4)
		p.line("  %s on a Tesla T4 (%s): selected=%v", name, t4.ID, ok)
		for _, reason := range why {
			p.line("    %s", reason)
		}
	}

	p.section("4. A class with mistakes is refused, with the field to fix")
	bad := &v1alpha1.ResourceClassSpec{ResourceSelector: []v1alpha1.ResourcePropertySelector{{
		MatchExpressions: []v1alpha1.ResourceSelectorRequirement{
			{Key: "memory", Operator: v1alpha1.ResourceSelectorOpGtEq, Values: []string{"30 gigs"}},
			{Key: "speed", Operator: v1alpha1.ResourceSelectorOpGt, Values: []string{"40000"}},
			{Key: "product", Operator: v1alpha1.ResourceSelectorOpLt, Values: []string{"A100"}},
		},
	}}}
	p.line("  spec: memory GtEq \"30 gigs\"; speed Gt \"40000\"; product Lt \"A100\"")
	for _, e := range selector.Validate(bad, field.NewPath("spec")) {
		p.line("    %s", e.Error())
	}

	p.section("5. The hand-off: the devices chosen for a pod, written on the pod")
	p.line("  Pod train-0 on dgx-a100: container \"train\" requests class.resclass.io/nvidia.high.mem: 2")
	p.line("  and class.resclass.io/fast.nic: 1; init container \"stage\" requests hugepages-1gig: 1.")
	p.line("  Devices picked first-fit here; the scheduler plugin adds its strategies.")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "train-0", Namespace: "ml"}}
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

	p.section("Done")
	p.line("Next: `make test` runs every test; `make bench` compares the selector with DRA's CEL selectors.")
	return p.err
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

func loadNodes(dir string) ([]node, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no node profiles in %s", dir)
	}
	sort.Strings(files)
	var out []node
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var nd v1alpha1.NodeDevices
		if err := yaml.UnmarshalStrict(data, &nd); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		n := node{name: nd.Name}
		for i := range nd.Status.Devices {
			d := selector.NewDevice(&nd.Status.Devices[i])
			if problems := d.Problems(); len(problems) > 0 {
				return nil, fmt.Errorf("%s: device %s: %v", f, d.ID, problems)
			}
			n.devices = append(n.devices, d)
		}
		out = append(out, n)
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
		if len(bytes.TrimSpace(doc)) > 0 && !isOnlyComments(doc) {
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

func countsString(kinds map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(kinds)) {
		parts = append(parts, fmt.Sprintf("%d %s", kinds[k], k))
	}
	return strings.Join(parts, ", ")
}

func nodeNames(nodes []node) []string {
	var names []string
	for _, n := range nodes {
		names = append(names, n.name)
	}
	return names
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
