package kubeletpods

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/types"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/resclass/resclass/pkg/internal/watchdog"
)

func list(pods ...[2]string) *podresourcesv1.ListPodResourcesResponse {
	resp := &podresourcesv1.ListPodResourcesResponse{}
	for _, p := range pods {
		resp.PodResources = append(resp.PodResources, &podresourcesv1.PodResources{Namespace: p[0], Name: p[1]})
	}
	return resp
}

func TestParse(t *testing.T) {
	pods, err := Parse(list([2]string{"ml", "train-0"}, [2]string{"kube-system", "coredns-5d78c9869d-x7x2m"}))
	if err != nil || len(pods) != 2 || !pods[types.NamespacedName{Namespace: "ml", Name: "train-0"}] {
		t.Fatalf("Parse: %v %v", pods, err)
	}
	if pods, err := Parse(&podresourcesv1.ListPodResourcesResponse{}); err != nil || len(pods) != 0 {
		t.Errorf("an empty answer: %v %v", pods, err)
	}
	for name, resp := range map[string]*podresourcesv1.ListPodResourcesResponse{
		"no namespace":     list([2]string{"", "p"}),
		"bad namespace":    list([2]string{"ML", "p"}),
		"long name":        list([2]string{"ml", strings.Repeat("p", 254)}),
		"name with a nul":  list([2]string{"ml", "p\x00"}),
		"more than a node": list(make([][2]string, MaxPods+1)...),
	} {
		if pods, err := Parse(resp); err == nil {
			t.Errorf("%s: accepted (%d pods)", name, len(pods))
		} else if len(err.Error()) > 300 {
			t.Errorf("%s: a message of %d bytes", name, len(err.Error()))
		}
	}
}

// FuzzParse: any answer is read in bounded time, and what is accepted names
// only valid pods, at most MaxPods.
func FuzzParse(f *testing.F) {
	for _, resp := range []*podresourcesv1.ListPodResourcesResponse{
		list([2]string{"ml", "train-0"}), list([2]string{"", ""}), {},
	} {
		data, _ := proto.Marshal(resp)
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		watchdog.Run(t, func() {
			resp := &podresourcesv1.ListPodResourcesResponse{}
			if proto.Unmarshal(data, resp) != nil {
				return
			}
			pods, err := Parse(resp)
			if err != nil {
				if len(err.Error()) > 400 {
					t.Fatalf("a message of %d bytes", len(err.Error()))
				}
				return
			}
			if len(pods) > MaxPods {
				t.Fatalf("%d pods accepted", len(pods))
			}
			for p := range pods {
				if p.Namespace == "" || len(p.Name) > 253 {
					t.Fatalf("accepted %q", p)
				}
			}
		})
	})
}
