package draplugin

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// podClaim is claim uid of pod (controlled by it, reserved for it), with one
// request per class, allocated the devices given.
func podClaim(uid string, pod *corev1.Pod, requests map[string][]string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: "claim-" + uid, UID: types.UID(uid),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr(true)}}},
		Status: resourceapi.ResourceClaimStatus{
			Allocation:  &resourceapi.AllocationResult{},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}},
		},
	}
	for _, class := range slices.Sorted(func(yield func(string) bool) {
		for k := range requests {
			if !yield(k) {
				return
			}
		}
	}) {
		request := "r-" + class
		c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, resourceapi.DeviceRequest{Name: request, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "rc-" + class}})
		for _, d := range requests[class] {
			c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{Request: request, Driver: testDriver, Pool: testNode, Device: d})
		}
	}
	return c
}

func ptr[T any](v T) *T { return &v }

func testPod(containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "pod-uid"}, Spec: corev1.PodSpec{Containers: containers}}
}

// withClient gives the fixture's plugin a client holding objs.
func (f *fixture) withClient(objs ...runtime.Object) {
	f.t.Helper()
	f.cfg.Client = fake.NewClientset(objs...)
	f.restart()
}

// containerEnv is what a runtime makes of the CDI devices the kubelet hands a
// container for its requests (each request's devices' CDI ids, in order):
// the CDI library applies them in turn, a later variable replacing an
// earlier one.
func (f *fixture) containerEnv(names ...string) map[string]string {
	f.t.Helper()
	out := map[string]string{}
	for _, kv := range f.containerSpec(names...).Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}

// containerSpec is the OCI spec a runtime makes of the CDI devices names, as
// containerEnv.
func (f *fixture) containerSpec(names ...string) *oci.Spec {
	f.t.Helper()
	// The fixture's device nodes are plain files, which CDI refuses: the
	// specs are read without them.
	dir := f.t.TempDir()
	files, err := filepath.Glob(filepath.Join(f.cfg.CDIDir, "*.json"))
	if err != nil {
		f.t.Fatal(err)
	}
	for _, file := range files {
		blob, err := os.ReadFile(file)
		if err != nil {
			f.t.Fatal(err)
		}
		var s specs.Spec
		if err := json.Unmarshal(blob, &s); err != nil {
			f.t.Fatal(err)
		}
		for i := range s.Devices {
			s.Devices[i].ContainerEdits.DeviceNodes = nil
		}
		if blob, err = json.Marshal(&s); err != nil {
			f.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(file)), blob, 0o600); err != nil {
			f.t.Fatal(err)
		}
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		f.t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{}}
	if unresolved, err := cache.InjectDevices(spec, names...); err != nil {
		f.t.Fatalf("inject %v: %v (unresolved %v, %v)", names, err, unresolved, cache.GetErrors())
	}
	return spec
}

func claimCDI(uid, request string) string { return CDIKind + "=" + uid + "-" + request }

// TestOneContainerSeesEveryRequest: a container asking for two classes in the
// extended-resource form (one claim, two requests) and for a third GPU of one
// of them through a claim of its own sees all its GPUs in
// NVIDIA_VISIBLE_DEVICES, and each class's in RESCLASS_DEVICES_<CLASS>, in
// whichever order the runtime applies the CDI devices.
func TestOneContainerSeesEveryRequest(t *testing.T) {
	f := newFixture(t)
	pod := testPod(corev1.Container{Name: "main", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "extra"}}}})
	ext := podClaim("ext", pod, map[string][]string{"big": {"gpu-0"}, "any": {"gpu-1"}})
	extra := podClaim("extra", pod, map[string][]string{"big": {"gpu-2"}})
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "extra", ResourceClaimTemplateName: ptr("t")}}
	pod.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "extra", ResourceClaimName: ptr(extra.Name)}}
	pod.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: ext.Name, RequestMappings: []corev1.ContainerExtendedResourceRequest{
		{ContainerName: "main", ResourceName: "class.resclass.io/big", RequestName: "r-big"},
		{ContainerName: "main", ResourceName: "class.resclass.io/any", RequestName: "r-any"},
	}}
	f.withClient(pod)
	for uid, res := range f.prepare(ext, extra) {
		if res.Err != nil {
			t.Fatalf("%s: %v", uid, res.Err)
		}
	}
	// Three requests of two claims of one pod, prepared in one call: the pod
	// is read once.
	gets := 0
	for _, a := range f.cfg.Client.(*fake.Clientset).Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == "pods" {
			gets++
		}
	}
	if gets != 1 {
		t.Errorf("preparing one pod's claims read the pod %d times, want once", gets)
	}
	names := []string{claimCDI("ext", "r-any"), claimCDI("ext", "r-big"), claimCDI("extra", "r-big")}
	for _, order := range [][]int{{0, 1, 2}, {2, 1, 0}, {1, 2, 0}} {
		var in []string
		for _, i := range order {
			in = append(in, names[i])
		}
		env := f.containerEnv(in...)
		if got := strings.Split(env["NVIDIA_VISIBLE_DEVICES"], ","); !sameSet(got, []string{"GPU-a", "GPU-b", "GPU-c"}) {
			t.Errorf("%v: NVIDIA_VISIBLE_DEVICES=%v, want the three GPUs", in, got)
		}
		if got := strings.Split(env["RESCLASS_DEVICES_BIG"], ","); !sameSet(got, []string{"GPU-a", "GPU-c"}) {
			t.Errorf("%v: RESCLASS_DEVICES_BIG=%v, want GPU-a,GPU-c", in, got)
		}
		if got := env["RESCLASS_DEVICES_ANY"]; got != "GPU-b" {
			t.Errorf("%v: RESCLASS_DEVICES_ANY=%q, want GPU-b", in, got)
		}
	}
}

// TestNoContainerSeesAnotherContainersGPUs: where merging would show a
// container GPUs it was not given, a request names its own devices. A claim
// used by two containers with different companions, and a claim anyone may
// share (no pod controls it), stay as they are.
func TestNoContainerSeesAnotherContainersGPUs(t *testing.T) {
	f := newFixture(t)
	pod := testPod(
		corev1.Container{Name: "one", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "x"}}}},
		corev1.Container{Name: "two", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "x"}, {Name: "y"}}}},
		corev1.Container{Name: "three", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "shared"}, {Name: "z"}}}},
	)
	x := podClaim("x", pod, map[string][]string{"any": {"gpu-0"}})
	y := podClaim("y", pod, map[string][]string{"any": {"gpu-1"}})
	z := podClaim("z", pod, map[string][]string{"any": {"gpu-2"}})
	shared := podClaim("shared", pod, map[string][]string{"any": {"gpu-3"}})
	shared.OwnerReferences = nil
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "x", ResourceClaimName: ptr(x.Name)}, {Name: "y", ResourceClaimName: ptr(y.Name)}, {Name: "z", ResourceClaimName: ptr(z.Name)}, {Name: "shared", ResourceClaimName: ptr(shared.Name)}}
	f.withClient(pod, shared)
	f.prepare(x, y, z)
	f.prepare(shared)
	if got := f.containerEnv(claimCDI("x", "r-any"))["NVIDIA_VISIBLE_DEVICES"]; got != "GPU-a" {
		t.Errorf("container one sees NVIDIA_VISIBLE_DEVICES=%s, want only its GPU-a", got)
	}
	if got := f.containerEnv(claimCDI("x", "r-any"), claimCDI("y", "r-any"))["NVIDIA_VISIBLE_DEVICES"]; !sameSet(strings.Split(got, ","), []string{"GPU-a", "GPU-b"}) {
		t.Errorf("container two, y last: NVIDIA_VISIBLE_DEVICES=%s, want GPU-a and GPU-b", got)
	}
	if got := f.containerEnv(claimCDI("shared", "r-any"))["NVIDIA_VISIBLE_DEVICES"]; got != "GPU-d" {
		t.Errorf("the shared claim names %s, want its own GPU-d", got)
	}
	if got := f.containerEnv(claimCDI("shared", "r-any"), claimCDI("z", "r-any"))["NVIDIA_VISIBLE_DEVICES"]; !sameSet(strings.Split(got, ","), []string{"GPU-c", "GPU-d"}) {
		t.Errorf("container three, its own claim last: NVIDIA_VISIBLE_DEVICES=%s, want GPU-c and GPU-d", got)
	}
}

func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}
