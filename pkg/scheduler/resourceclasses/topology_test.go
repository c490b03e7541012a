package resourceclasses

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
)

// topologyProfiles are the simulated machines of e2e/profiles with a topology.
var topologyProfiles = []string{"dgx-a100", "dgx1-hybrid-mesh", "pcie-4gpu"}

// profileNode is a profile's devices in a cache with the gpu and nic classes.
func profileNode(t testing.TB, profile string) (*cache, *nodeState, []v1alpha1.Device) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "e2e", "profiles", profile+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var nd v1alpha1.NodeDevices
	if err := yaml.UnmarshalStrict(data, &nd); err != nil {
		t.Fatal(err)
	}
	nd.ResourceVersion = "1"
	c := newCache()
	c.setClass(gpuClass)
	c.setClass(nicClass)
	if invalid, _ := c.setNodeDevices(&nd); len(invalid) > 0 {
		t.Fatalf("%s: invalid devices %v", profile, invalid)
	}
	return c, c.nodes[nd.Name], nd.Status.Devices
}

// oracle scores pairs straight from the published attributes, apart from the
// strategy's own reading of them: NVLinks (the fewer of what the two GPUs
// say), one switch, one root, one NUMA node.
type oracle struct{ w [][]topoScore }

func newOracle(t testing.TB, devs []v1alpha1.Device) oracle {
	str := func(d v1alpha1.Device, a string) string {
		if v := d.Attributes[a].StringValue; v != nil {
			return *v
		}
		return ""
	}
	links := func(a, b v1alpha1.Device) int32 {
		s := str(a, v1alpha1.AttributeNVLinkPeerLinks)
		if s == "" || b.Attributes[v1alpha1.AttributeIndex].IntValue == nil {
			return 0
		}
		p, err := nvidiagpu.ParsePeerLinks(s)
		if err != nil {
			t.Fatal(err)
		}
		return int32(p[int(*b.Attributes[v1alpha1.AttributeIndex].IntValue)])
	}
	o := oracle{w: make([][]topoScore, len(devs))}
	for i, a := range devs {
		o.w[i] = make([]topoScore, len(devs))
		for j, b := range devs {
			if i == j {
				continue
			}
			s := &o.w[i][j]
			s.nv = min(links(a, b), links(b, a))
			if r := str(a, v1alpha1.AttributePCIeSwitch); r != "" && r == str(b, v1alpha1.AttributePCIeSwitch) {
				s.sw = 1
			}
			if r := str(a, v1alpha1.AttributePCIeRoot); r != "" && r == str(b, v1alpha1.AttributePCIeRoot) {
				s.root = 1
			}
			if na, nb := a.Attributes[v1alpha1.AttributeNUMANode].IntValue, b.Attributes[v1alpha1.AttributeNUMANode].IntValue; na != nil && nb != nil && *na == *nb {
				s.numa = 1
			}
		}
	}
	return o
}

func (o oracle) score(set []int) topoScore {
	var s topoScore
	for x, i := range set {
		for _, j := range set[x+1:] {
			s = s.add(o.w[i][j])
		}
	}
	return s
}

func (o oracle) cut(set, free []int) topoScore {
	var s topoScore
	for _, i := range set {
		for _, f := range free {
			if !slices.Contains(set, f) {
				s = s.add(o.w[i][f])
			}
		}
	}
	return s
}

// subsets calls f with every k-subset of from.
func subsets(from []int, k int, f func([]int)) {
	set := make([]int, 0, k)
	var walk func(start int)
	walk = func(start int) {
		if len(set) == k {
			f(set)
			return
		}
		for i := start; i <= len(from)-(k-len(set)); i++ {
			set = append(set, from[i])
			walk(i + 1)
			set = set[:len(set)-1]
		}
	}
	walk(0)
}

// placed is the positions of the devices p gives class.
func placed(n *nodeState, p *placement, class string) []int {
	var out []int
	for _, id := range p.drawn[class] {
		out = append(out, n.index[id])
	}
	slices.Sort(out)
	return out
}

// TestTopologyIsOptimal: on every profile, for every k and a range of
// partially used states, the set Topology gives a k-GPU pod has the best
// score an exhaustive search finds, and among the sets with that score the
// smallest cut to the devices left free.
func TestTopologyIsOptimal(t *testing.T) {
	rng := rand.New(rand.NewPCG(22, 1))
	for _, profile := range topologyProfiles {
		_, n, devs := profileNode(t, profile)
		o := newOracle(t, devs)
		gpus := n.matches[gpuClass.Name]
		states := [][]int{nil}
		for range 40 {
			var used []int
			for _, i := range gpus {
				if rng.IntN(3) == 0 {
					used = append(used, i)
				}
			}
			states = append(states, used)
		}
		checked := 0
		for _, used := range states {
			for _, i := range gpus {
				n.devices[i].holders = 0
			}
			for _, i := range used {
				n.devices[i].holders = 1
			}
			var freeGPUs, freeAll []int
			for i, d := range n.devices {
				if d.holders == 0 && d.pool == nil && !d.excluded && d.healthy {
					freeAll = append(freeAll, i)
					if slices.Contains(gpus, i) {
						freeGPUs = append(freeGPUs, i)
					}
				}
			}
			for k := 1; k <= 8; k++ {
				d, err := podDemand(gpuPod("p", gpuClass.Name, k))
				if err != nil {
					t.Fatal(err)
				}
				p, u := n.place(d, Topology)
				if k > len(freeGPUs) {
					if u == nil {
						t.Errorf("%s used %v: %d GPUs placed on %d free", profile, used, k, len(freeGPUs))
					}
					continue
				}
				if u != nil {
					t.Fatalf("%s used %v k=%d: %s", profile, used, k, u.reason)
				}
				got := placed(n, p, gpuClass.Name)
				bestScore, bestCut := topoScore{-1, 0, 0, 0}, topoScore{}
				subsets(freeGPUs, k, func(s []int) {
					sc, cut := o.score(s), o.cut(s, freeAll)
					if c := sc.cmp(bestScore); c > 0 || c == 0 && cut.cmp(bestCut) < 0 {
						bestScore, bestCut = sc, cut
					}
				})
				if sc, cut := o.score(got), o.cut(got, freeAll); sc != bestScore || cut != bestCut {
					t.Errorf("%s used %v k=%d: Topology chose %v (score %v, cut %v); the optimum is score %v, cut %v", profile, used, k, got, sc, cut, bestScore, bestCut)
				}
				checked++
			}
		}
		t.Logf("%s: %d placements equal to the exhaustive optimum", profile, checked)
	}
}

// TestTopologyFeasibilityIsTheStrategys: a node fits a pod with Topology
// exactly when it fits with FirstFit (the matching decides), here with
// overlapping classes (every NIC-less GPU class also matches) and a GPU + NIC
// pod.
func TestTopologyFeasibilityIsTheStrategys(t *testing.T) {
	_, n, _ := profileNode(t, "dgx1-hybrid-mesh")
	rng := rand.New(rand.NewPCG(22, 2))
	for range 200 {
		for _, i := range n.matches[gpuClass.Name] {
			n.devices[i].holders = rng.IntN(2)
		}
		for _, i := range n.matches[nicClass.Name] {
			n.devices[i].holders = rng.IntN(2)
		}
		k, m := 1+rng.IntN(8), 1+rng.IntN(2)
		pod := testPod("p", ctr{name: "app", limits: map[corev1.ResourceName]string{cls(gpuClass.Name): strconv.Itoa(k), cls(nicClass.Name): strconv.Itoa(m)}})
		d, err := podDemand(pod)
		if err != nil {
			t.Fatal(err)
		}
		_, uf := n.place(d, FirstFit)
		p, ut := n.place(d, Topology)
		if (uf == nil) != (ut == nil) {
			t.Fatalf("FirstFit says %v, Topology %v", uf, ut)
		}
		if p != nil && len(p.drawn[gpuClass.Name]) != k {
			t.Fatalf("Topology gave %v for %d GPUs", p.drawn, k)
		}
	}
}

// TestTopologyRefusesForgedLinks: an nvlinkPeerLinks value that does not
// parse makes its device invalid, with the parser's reason, as any unreadable
// attribute does; peers the node does not have count for nothing.
func TestTopologyRefusesForgedLinks(t *testing.T) {
	gpu := func(id string, index int64, links string) v1alpha1.Device {
		return v1alpha1.Device{ID: id, Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{
			v1alpha1.AttributeIndex: v1alpha1.IntAttribute(index), v1alpha1.AttributeNVLinkPeerLinks: v1alpha1.StringAttribute(links)}}
	}
	c := newCache()
	invalid, _ := c.setNodeDevices(nodeDevices("n1", gpu("a", 0, "1:2,7:3"), gpu("b", 1, "0:64"), gpu("c", 2, "1:99999"), gpu("d", 3, strings.Repeat("1:1,", 70))))
	if len(invalid) != 2 || invalid[0].id != "c" || !strings.Contains(invalid[0].reason, "nvlinkPeerLinks") || !strings.Contains(invalid[1].reason, "bytes") {
		t.Errorf("invalid = %+v; want c and d refused for their nvlinkPeerLinks", invalid)
	}
	n := c.nodes["n1"]
	if got := n.pair(0, 1).nv; got != 2 {
		t.Errorf("a-b: %d NVLinks, want 2 (the fewer of 2 and 64)", got)
	}
	if len(n.devices[0].peers) != 1 {
		t.Errorf("a's peers %v: index 7 is no GPU of the node", n.devices[0].peers)
	}
}

// TestTopologyGPUAndNIC: on the PCIe box a pod asking for a GPU and a NIC
// gets the GPU under the NIC's switch (GPUs 2-3), which the plain order (GPU
// 0) does not give.
func TestTopologyGPUAndNIC(t *testing.T) {
	_, n, devs := profileNode(t, "pcie-4gpu")
	d, err := podDemand(testPod("p", ctr{name: "app", limits: map[corev1.ResourceName]string{cls(gpuClass.Name): "1", cls(nicClass.Name): "1"}}))
	if err != nil {
		t.Fatal(err)
	}
	sw := func(i int) string { return *devs[i].Attributes[v1alpha1.AttributePCIeSwitch].StringValue }
	for _, s := range []Strategy{FirstFit, Topology} {
		p, u := n.place(d, s)
		if u != nil {
			t.Fatal(u.reason)
		}
		gpu, nic := placed(n, p, gpuClass.Name)[0], placed(n, p, nicClass.Name)[0]
		if same := sw(gpu) == sw(nic); same != (s == Topology) {
			t.Errorf("%s: GPU %s (switch %s), NIC %s (switch %s)", s, devs[gpu].ID, sw(gpu), devs[nic].ID, sw(nic))
		}
		if s == Topology && p.quality != 75 {
			t.Errorf("Topology: quality %d, want 75 (one switch)", p.quality)
		}
	}
}

// TestTopologyArrivals: a sequence of pods arriving and leaving on the hybrid
// cube mesh. A placement is poorly connected when two of its GPUs share no
// NVLink. Topology must give fewer such placements than FirstFit and than a
// greedy pairwise baseline (the best-linked pair, then the GPU with the most
// links to those chosen), the best effort NVIDIA's device plugin makes.
func TestTopologyArrivals(t *testing.T) {
	_, n, devs := profileNode(t, "dgx1-hybrid-mesh")
	o := newOracle(t, devs)
	gpus := n.matches[gpuClass.Name]
	poor := func(set []int) bool {
		for x, i := range set {
			for _, j := range set[x+1:] {
				if o.w[i][j].nv == 0 {
					return true
				}
			}
		}
		return false
	}
	greedy := func(free []int, k int) []int {
		var set []int
		gain := func(i int) int32 {
			var s int32
			for _, j := range set {
				s += o.w[i][j].nv
			}
			return s
		}
		if k >= 2 {
			bi, bj := -1, -1
			for x, i := range free {
				for _, j := range free[x+1:] {
					if bi < 0 || o.w[i][j].nv > o.w[bi][bj].nv {
						bi, bj = i, j
					}
				}
			}
			set = []int{bi, bj}
		}
		for len(set) < k {
			best := -1
			for _, i := range free {
				if !slices.Contains(set, i) && (best < 0 || gain(i) > gain(best)) {
					best = i
				}
			}
			set = append(set, best)
		}
		slices.Sort(set)
		return set
	}
	type strategy struct {
		name   string
		choose func(k int) []int
	}
	free := func() []int {
		var out []int
		for _, i := range gpus {
			if n.devices[i].holders == 0 {
				out = append(out, i)
			}
		}
		return out
	}
	byPlace := func(s Strategy) func(int) []int {
		return func(k int) []int {
			d, err := podDemand(gpuPod("p", gpuClass.Name, k))
			if err != nil {
				t.Fatal(err)
			}
			p, u := n.place(d, s)
			if u != nil {
				return nil
			}
			return placed(n, p, gpuClass.Name)
		}
	}
	counts := map[string][2]int{}
	for _, s := range []strategy{{"Topology", byPlace(Topology)}, {"FirstFit", byPlace(FirstFit)}, {"greedy pairwise", func(k int) []int {
		if f := free(); len(f) >= k {
			return greedy(f, k)
		}
		return nil
	}}} {
		rng := rand.New(rand.NewPCG(22, 3)) // the same arrivals for each
		for _, i := range gpus {
			n.devices[i].holders = 0
		}
		var running [][]int
		var placedPods, poorPods int
		for range 2000 {
			if len(running) > 0 && rng.IntN(2) == 0 {
				x := rng.IntN(len(running))
				for _, i := range running[x] {
					n.devices[i].holders = 0
				}
				running = slices.Delete(running, x, x+1)
				continue
			}
			k := []int{1, 2, 2, 4, 4}[rng.IntN(5)]
			set := s.choose(k)
			if set == nil {
				continue
			}
			for _, i := range set {
				n.devices[i].holders = 1
			}
			running = append(running, set)
			if k >= 2 {
				placedPods++
				if poor(set) {
					poorPods++
				}
			}
		}
		counts[s.name] = [2]int{poorPods, placedPods}
		t.Logf("%s: %d of %d multi-GPU placements poorly connected", s.name, poorPods, placedPods)
	}
	for _, other := range []string{"FirstFit", "greedy pairwise"} {
		if counts["Topology"][0] >= counts[other][0] {
			t.Errorf("Topology gave %d poorly connected placements, %s %d", counts["Topology"][0], other, counts[other][0])
		}
	}
}

// TestTopologyGreedyBeyondTheLimit: past exhaustiveSets (16 GPUs, C(16,4) =
// 1820 sets) the greedy search still gives k distinct free GPUs, and finds a
// fully NVLink-connected group where one is left: GPUs in groups of four,
// linked within the group, with one GPU of each of the first three groups
// taken.
func TestTopologyGreedyBeyondTheLimit(t *testing.T) {
	var devs []v1alpha1.Device
	for i := range 16 {
		var links []string
		for j := i / 4 * 4; j < i/4*4+4; j++ {
			if j != i {
				links = append(links, strconv.Itoa(j)+":1")
			}
		}
		devs = append(devs, v1alpha1.Device{ID: "g" + strconv.Itoa(i), Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, Attributes: map[string]v1alpha1.DeviceAttribute{
			v1alpha1.AttributeIndex: v1alpha1.IntAttribute(int64(i)), v1alpha1.AttributeNVLinkPeerLinks: v1alpha1.StringAttribute(strings.Join(links, ","))}})
	}
	c := newCache()
	c.setClass(gpuClass)
	c.setNodeDevices(nodeDevices("n16", devs...))
	n := c.nodes["n16"]
	if binomialAtMost(16, 4, exhaustiveSets) {
		t.Fatal("C(16,4) within the exhaustive limit: the test would not reach the greedy search")
	}
	for _, i := range []int{0, 5, 10} {
		n.devices[i].holders = 1
	}
	for k := 1; k <= 13; k++ {
		d, err := podDemand(gpuPod("p", gpuClass.Name, k))
		if err != nil {
			t.Fatal(err)
		}
		p, u := n.place(d, Topology)
		if u != nil {
			t.Fatalf("k=%d: %s", k, u.reason)
		}
		got := placed(n, p, gpuClass.Name)
		if len(got) != k || len(slices.Compact(slices.Clone(got))) != k || slices.ContainsFunc(got, func(i int) bool { return n.devices[i].holders > 0 }) {
			t.Fatalf("k=%d: %v is not %d distinct free GPUs", k, got, k)
		}
		if k == 4 && (!slices.Equal(got, []int{12, 13, 14, 15}) || p.quality != 100) {
			t.Errorf("k=4: %v (quality %d), want the whole group 12-15", got, p.quality)
		}
	}
}

// TestTopologyThroughThePlugin: with strategy Topology the plugin scores the
// hybrid mesh, whose free GPUs include a fully NVLink-connected quad, above
// the PCIe box, whose GPUs share only switches; Reserve gives the quad and
// observes its quality (100) in resclass_scheduler_topology_placement_quality.
func TestTopologyThroughThePlugin(t *testing.T) {
	var nds []*v1alpha1.NodeDevices
	for _, profile := range []string{"dgx1-hybrid-mesh", "pcie-4gpu"} {
		_, _, devs := profileNode(t, profile)
		nds = append(nds, nodeDevices(profile, devs...))
	}
	h := newHarness(t, Topology, nds, allClasses)
	pod := gpuPod("quad", gpuClass.Name, 4)
	cs, _, st := h.preFilter(pod)
	if !st.IsSuccess() {
		t.Fatal(st)
	}
	scores := h.scores(cs, pod, "dgx1-hybrid-mesh", "pcie-4gpu")
	if scores["dgx1-hybrid-mesh"] <= scores["pcie-4gpu"] {
		t.Errorf("scores %v: want the hybrid mesh above the PCIe box", scores)
	}
	observed := func() (uint64, float64) {
		vec, err := testutil.GetHistogramVecFromGatherer(legacyregistry.DefaultGatherer, "resclass_scheduler_topology_placement_quality", nil)
		if err != nil {
			return 0, 0 // nothing observed yet
		}
		return vec.GetAggregatedSampleCount(), vec.GetAggregatedSampleSum()
	}
	before, sumBefore := observed()
	_, placed := h.reserve(pod, "dgx1-hybrid-mesh")
	if got := placed.Devices("app", gpuClass.Name); len(got) != 4 {
		t.Fatalf("placed %v", got)
	}
	if after, sum := observed(); after != before+1 || sum-sumBefore != 100 {
		t.Errorf("topology_placement_quality: %d observations (before %d), sum grew by %v; want one more, of 100", after, before, sum-sumBefore)
	}
}
