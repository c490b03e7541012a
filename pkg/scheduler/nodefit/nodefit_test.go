package nodefit

import (
	"context"
	"os"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
)

// TestMain sets the feature gates as cmd/scheduler does: DRAExtendedResource
// off (with it on, NodeResourcesFit also asks DRA about extended resources).
func TestMain(m *testing.M) {
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{"DRAExtendedResource": false}); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

const (
	plain = corev1.ResourceName("example.com/gpu")
	class = corev1.ResourceName("class.resclass.io/nvidia-a100-80g")
)

// node has 4 CPUs, 8 of example.com/gpu and no class allocatable (a node
// whose agent has not registered, or a simulated one); a pod there already
// requests 3 CPUs.
func node() fwk.NodeInfo {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("16Gi"),
		corev1.ResourcePods: resource.MustParse("110"), plain: resource.MustParse("8"),
	}}}
	ni := framework.NewNodeInfo(pod("running", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}))
	ni.SetNode(n)
	return ni
}

func pod(name string, requests corev1.ResourceList) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{NodeName: "", Containers: []corev1.Container{{Name: "app", Resources: corev1.ResourceRequirements{
			Requests: requests, Limits: requests.DeepCopy()}}}}}
}

func q(s string) resource.Quantity { return resource.MustParse(s) }

// upstream is NodeResourcesFit itself with the given ignored groups.
func upstream(t testing.TB, ignoredGroups ...string) *noderesources.Fit {
	t.Helper()
	args := &config.NodeResourcesFitArgs{IgnoredResourceGroups: ignoredGroups, ScoringStrategy: &config.ScoringStrategy{
		Type: config.LeastAllocated, Resources: []config.ResourceSpec{{Name: "cpu", Weight: 1}, {Name: "memory", Weight: 1}}}}
	pl, err := noderesources.NewFit(t.Context(), args, nil, feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate))
	if err != nil {
		t.Fatal(err)
	}
	return pl.(*noderesources.Fit)
}

func ours(t testing.TB, raw string) *Plugin {
	t.Helper()
	var obj runtime.Object
	if raw != "" {
		obj = &runtime.Unknown{Raw: []byte(raw), ContentType: runtime.ContentTypeJSON}
	}
	pl, err := New(t.Context(), obj, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pl.(*Plugin)
}

type filterer interface {
	PreFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status)
	Filter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) *fwk.Status
}

func filter(t testing.TB, pl filterer, p *corev1.Pod, ni fwk.NodeInfo) *fwk.Status {
	t.Helper()
	cs := framework.NewCycleState()
	if _, st := pl.PreFilter(t.Context(), cs, p, []fwk.NodeInfo{ni}); !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	return pl.Filter(t.Context(), cs, p, ni)
}

// TestFilterIsUpstreamsWithClassesIgnored: for pods with and without class
// requests, the plugin answers as NodeResourcesFit with
// ignoredResourceGroups [class.resclass.io] does (CPU, other extended
// resources and the pod count still checked), while NodeResourcesFit without
// that setting refuses every class request on a node without class
// allocatable: the class requests are what the plugin hides, and only them.
func TestFilterIsUpstreamsWithClassesIgnored(t *testing.T) {
	ni := node()
	ignoring, counting, pl := upstream(t, "class.resclass.io"), upstream(t), ours(t, "")
	cases := []struct {
		name     string
		requests corev1.ResourceList
		want     string // "" fits, else a reason the status carries
	}{
		{"class only", corev1.ResourceList{class: q("1")}, ""},
		{"class and a CPU", corev1.ResourceList{class: q("2"), corev1.ResourceCPU: q("1")}, ""},
		{"class and too much CPU", corev1.ResourceList{class: q("1"), corev1.ResourceCPU: q("2")}, "Insufficient cpu"},
		{"class and the plain GPUs", corev1.ResourceList{class: q("1"), plain: q("8")}, ""},
		{"class and too many plain GPUs", corev1.ResourceList{class: q("1"), plain: q("9")}, "Insufficient example.com/gpu"},
		{"no class", corev1.ResourceList{plain: q("1"), corev1.ResourceMemory: q("1Gi")}, ""},
		{"no class, too much memory", corev1.ResourceList{corev1.ResourceMemory: q("17Gi")}, "Insufficient memory"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := pod("p", c.requests)
			before := p.DeepCopy()
			got, want := filter(t, pl, p, ni), filter(t, ignoring, p, ni)
			if got.Code() != want.Code() || !reflect.DeepEqual(reasons(got), reasons(want)) {
				t.Errorf("ours %v, NodeResourcesFit ignoring the classes %v", got, want)
			}
			if c.want == "" && !got.IsSuccess() || c.want != "" && !strings.Contains(strings.Join(reasons(got), "; "), c.want) {
				t.Errorf("ours %v, want %q", got, c.want)
			}
			if _, hasClass := c.requests[class]; hasClass && c.want == "" {
				if st := filter(t, counting, p, ni); st.IsSuccess() {
					t.Errorf("NodeResourcesFit counting the classes passed the node without class allocatable: the case proves nothing")
				}
			}
			if !reflect.DeepEqual(p, before) {
				t.Errorf("the pod was changed: %+v", p.Spec.Containers[0].Resources)
			}
		})
	}
}

// reasons are st's reasons; none for success (a nil status).
func reasons(st *fwk.Status) []string {
	if st == nil {
		return nil
	}
	return st.Reasons()
}

func TestWithoutClasses(t *testing.T) {
	plainPod := pod("plain", corev1.ResourceList{plain: q("1")})
	if WithoutClasses(plainPod) != plainPod {
		t.Errorf("a pod without class requests was copied")
	}
	p := pod("p", corev1.ResourceList{class: q("1"), corev1.ResourceCPU: q("1")})
	p.Spec.InitContainers = []corev1.Container{{Name: "init", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{class: q("2")}}}}
	before := p.DeepCopy()
	got := WithoutClasses(p)
	for _, c := range append(got.Spec.InitContainers, got.Spec.Containers...) {
		for _, list := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
			if _, ok := list[class]; ok {
				t.Errorf("container %s still requests %s", c.Name, class)
			}
		}
	}
	if _, ok := got.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU]; !ok {
		t.Errorf("the CPU request was dropped too")
	}
	if !reflect.DeepEqual(p, before) {
		t.Errorf("the original pod was changed")
	}
}

func TestArgs(t *testing.T) {
	pl := ours(t, `{"scoringStrategy":{"type":"MostAllocated","resources":[{"name":"cpu","weight":1}]}}`)
	if pl.Name() != Name {
		t.Errorf("Name %q", pl.Name())
	}
	if _, err := New(t.Context(), &runtime.Unknown{Raw: []byte(`{"scoringStrategy":{"type":"Bogus"}}`), ContentType: runtime.ContentTypeJSON}, nil); err == nil || !strings.Contains(err.Error(), "Bogus") {
		t.Errorf("an unknown scoring strategy: %v, want it refused", err)
	}
	if _, err := New(t.Context(), &runtime.Unknown{Raw: []byte(`{"ignoredResources":["not a name"]}`), ContentType: runtime.ContentTypeJSON}, nil); err == nil {
		t.Errorf("an invalid ignored resource was accepted")
	}
}

// BenchmarkNodeFitFilter: NodeResourcesFit's Filter of a pod of one
// class.resclass.io request and a CPU on one node, as the scheduler runs it on
// every node it filters. baseline-ignored-groups is upstream's plugin with
// ignoredResourceGroups (what the profile ran before); without-classes is
// this package's.
func BenchmarkNodeFitFilter(b *testing.B) {
	ni := node()
	p := pod("p", corev1.ResourceList{class: q("1"), corev1.ResourceCPU: q("100m")})
	run := func(b *testing.B, pl filterer) {
		cs := framework.NewCycleState()
		if _, st := pl.PreFilter(b.Context(), cs, p, []fwk.NodeInfo{ni}); !st.IsSuccess() {
			b.Fatal(st)
		}
		for b.Loop() {
			if st := pl.Filter(b.Context(), cs, p, ni); !st.IsSuccess() {
				b.Fatal(st)
			}
		}
	}
	b.Run("baseline-ignored-groups", func(b *testing.B) { run(b, upstream(b, "class.resclass.io")) })
	b.Run("without-classes", func(b *testing.B) { run(b, ours(b, "")) })
}
