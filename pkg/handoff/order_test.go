package handoff

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"

	"github.com/resclass/resclass/pkg/kubeletpods"
)

// kubelet answers Known with the pods it lists, or err.
type kubelet struct {
	mu    sync.Mutex
	pods  []string // names in namespace ml
	err   error
	asked int
}

func (k *kubelet) Known(context.Context) (kubeletpods.Pods, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.asked++
	if k.err != nil {
		return nil, k.err
	}
	out := kubeletpods.Pods{}
	for _, n := range k.pods {
		out[types.NamespacedName{Namespace: "ml", Name: n}] = true
	}
	return out, nil
}

func (k *kubelet) set(err error, pods ...string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pods, k.err = pods, err
}

func (k *kubelet) questions() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.asked
}

// orderFixture: older pod a (GPU-0) and newer pod b (GPU-1) wait for one GPU
// each.
func orderFixture(t *testing.T) (*fixture, *kubelet) {
	a := pod("a", map[string]map[string][]string{"train": {"nvidia.high.mem": {"GPU-0"}}})
	b := pod("b", map[string]map[string][]string{"train": {"nvidia.high.mem": {"GPU-1"}}})
	f := newFixture(t, a, b)
	k := &kubelet{}
	f.alloc.cfg.KubeletPods = k
	return f, k
}

var allGPUs = []string{"GPU-0", "GPU-1", "GPU-2", "GPU-3"}

// The kubelet admits the newer pod first: it lists b and not a, so b gets its
// own GPU, not a's; then a gets its own.
func TestKubeletAdmitsTheNewerPodFirst(t *testing.T) {
	f, k := orderFixture(t)
	k.set(nil, "b", "running-elsewhere")
	if got := f.preferred(highMem, 1, allGPUs); !slices.Equal(got, []string{"GPU-1"}) {
		t.Fatalf("preferred while the kubelet admits b: %v, want b's GPU-1", got)
	}
	if _, err := f.allocate(highMem, "GPU-1"); err != nil {
		t.Fatal(err)
	}
	k.set(nil, "a", "b")
	asked := k.questions()
	if got := f.preferred(highMem, 1, []string{"GPU-0", "GPU-2", "GPU-3"}); !slices.Equal(got, []string{"GPU-0"}) {
		t.Fatalf("preferred for a: %v, want GPU-0", got)
	}
	if _, err := f.allocate(highMem, "GPU-0"); err != nil {
		t.Fatal(err)
	}
	if k.questions() != asked {
		t.Errorf("the kubelet was asked with one pod left waiting: nothing to tell apart")
	}
	recs := f.alloc.Allocations()
	if len(recs) != 2 || recs[0].Name != "a" || recs[0].Devices[0] != "GPU-0" || recs[1].Name != "b" || recs[1].Devices[0] != "GPU-1" {
		t.Errorf("allocations %+v, want a on GPU-0 and b on GPU-1", recs)
	}
	if n := testutil.ToFloat64(f.metrics.orders.WithLabelValues("preferred", "asked")); n != 1 {
		t.Errorf("asked for preferred: %v, want 1", n)
	}
	if len(f.events()) != 0 {
		t.Errorf("Events on an answered order")
	}
}

// A kubelet that does not answer leaves the guess (the oldest), counted and
// told on the pod.
func TestKubeletSilentLeavesTheGuess(t *testing.T) {
	f, k := orderFixture(t)
	k.set(errors.New("connection refused"))
	if got := f.preferred(highMem, 1, allGPUs); !slices.Equal(got, []string{"GPU-0"}) {
		t.Fatalf("preferred without an answer: %v, want the oldest pod's GPU-0", got)
	}
	if n := testutil.ToFloat64(f.metrics.orders.WithLabelValues("preferred", "guessed")); n != 1 {
		t.Errorf("guessed: %v, want 1", n)
	}
	ev := f.events()
	if len(ev) != 1 || !strings.Contains(ev[0], ReasonOrderGuessed) || !strings.Contains(ev[0], "connection refused") || !strings.Contains(ev[0], "ml/a") {
		t.Errorf("events %v, want one %s naming the error and the pod", ev, ReasonOrderGuessed)
	}
}

// The kubelet lists none of the waiting pods: the one it admits is not in the
// cache yet, and no pod is offered.
func TestKubeletAdmitsAPodNotCachedYet(t *testing.T) {
	f, k := orderFixture(t)
	k.set(nil, "c")
	if got := f.preferred(highMem, 1, allGPUs); got != nil {
		t.Fatalf("preferred for a pod the agent does not have: %v, want none", got)
	}
	if n := testutil.ToFloat64(f.metrics.orders.WithLabelValues("preferred", "waited")); n < 1 {
		t.Errorf("waited: %v, want at least 1", n)
	}
	// Allocate of a's exact GPU: one pod has that assignment, nothing to ask.
	asked := k.questions()
	if _, err := f.allocate(highMem, "GPU-0"); err != nil {
		t.Fatalf("allocate of a's exact devices: %v", err)
	}
	if k.questions() != asked {
		t.Errorf("the kubelet was asked about devices only one pod was assigned")
	}
}
