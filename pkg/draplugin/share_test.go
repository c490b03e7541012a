package draplugin

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/devicekind"
	"github.com/resclass/resclass/pkg/devicekind/hugepages"
	"github.com/resclass/resclass/pkg/devicekind/nic"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/handoff"
)

// The MPS directory the agent is given (--mps-dir, through the nvidia-gpu
// kind): the mounts' host paths are below it.
const testMPSDir = "/var/lib/test-mps"

func sharedGPU(uuid string, minor int64, mode v1alpha1.SharingMode, memory, compute string) v1alpha1.Device {
	d := gpu(uuid, minor)
	d.Attributes[v1alpha1.AttributeMemory] = v1alpha1.QuantityAttribute(resource.MustParse("40Gi"))
	d.Sharing = &v1alpha1.DeviceSharing{Mode: mode, Capacity: map[string]resource.Quantity{}}
	if memory != "" {
		d.Sharing.Capacity[v1alpha1.CapacityMemory] = resource.MustParse(memory)
	}
	if compute != "" {
		d.Sharing.Capacity[v1alpha1.CapacityCompute] = resource.MustParse(compute)
	}
	return d
}

// newShareFixture is a plugin over a GPU in MPS mode (gpu-m, 40Gi and 100%),
// one time-sliced (gpu-t), one sharing memory only (gpu-o) and one served
// whole (gpu-0).
func newShareFixture(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t)
	f.cfg.Kinds = devicekind.NewRegistry(nvidiagpu.Kind{MPSDir: testMPSDir}, nic.Kind{}, hugepages.Kind{})
	f.restart()
	setSharedDevices(f)
	return f
}

func setSharedDevices(f *fixture) {
	f.p.SetDevices([]v1alpha1.Device{
		sharedGPU("GPU-m", 0, v1alpha1.SharingMPS, "40Gi", "100"),
		sharedGPU("GPU-t", 1, v1alpha1.SharingTimeSlicing, "40Gi", "100"),
		sharedGPU("GPU-o", 2, v1alpha1.SharingMPS, "40Gi", ""),
		gpu("GPU-a", 3),
	}, map[string]string{"gpu-m": "GPU-m", "gpu-t": "GPU-t", "gpu-o": "GPU-o", "gpu-0": "GPU-a"})
}

// shareClaim is a claim of class gpu-share allocated a share of device: the
// consumedCapacity entries given as name, value pairs ("s/<name>" for
// share.resclass.io/<name>, others as written: "memory" is the GPU's own).
func shareClaim(uid, device string, consumed ...string) *resourceapi.ResourceClaim {
	c := claim(uid, "gpu-share", device)
	r := &c.Status.Allocation.Devices.Results[0]
	r.ShareID = ptr(types.UID("00000000-0000-0000-0000-0000000000" + fmt.Sprintf("%02d", len(uid))))
	r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{}
	for i := 0; i+1 < len(consumed); i += 2 {
		name := consumed[i]
		if rest, ok := strings.CutPrefix(name, "s/"); ok {
			name = "share.resclass.io/" + rest
		}
		r.ConsumedCapacity[resourceapi.QualifiedName(name)] = resource.MustParse(consumed[i+1])
	}
	return c
}

// edits is the claim's one CDI device's environment, as a map, and mounts.
func edits(t *testing.T, s *specs.Spec) (map[string]string, []*specs.Mount) {
	t.Helper()
	if len(s.Devices) != 1 {
		t.Fatalf("%d CDI devices", len(s.Devices))
	}
	env := map[string]string{}
	for _, kv := range s.Devices[0].ContainerEdits.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env, s.Devices[0].ContainerEdits.Mounts
}

func TestPrepareTwoSharesOfOneGPU(t *testing.T) {
	f := newShareFixture(t)
	res := f.prepare(
		shareClaim("u1", "gpu-m", "s/memory", "10Gi", "s/compute", "25", "memory", "0"),
		shareClaim("u22", "gpu-m", "s/memory", "20Gi", "s/compute", "50", "memory", "0"),
	)
	for uid, r := range res {
		if r.Err != nil {
			t.Fatalf("%s: %v", uid, r.Err)
		}
	}
	for _, tc := range []struct {
		uid                         string
		memory, compute, limit, pct string
	}{
		{"u1", "10737418240", "25", "0=10240M", "25"},
		{"u22", "21474836480", "50", "0=20480M", "50"},
	} {
		env, mounts := edits(t, f.spec(tc.uid))
		want := map[string]string{
			"RESCLASS_SHARE_MEMORY":             tc.memory,
			"RESCLASS_SHARE_COMPUTE":            tc.compute,
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  tc.limit,
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": tc.pct,
			"CUDA_MPS_PIPE_DIRECTORY":           "/run/resclass/mps/GPU-m/pipe",
			"NVIDIA_VISIBLE_DEVICES":            "GPU-m",
		}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("%s: %s=%q, want %q (env %v)", tc.uid, k, env[k], v, env)
			}
		}
		got := map[string]string{}
		for _, m := range mounts {
			if m.Type != "bind" || !slices.Equal(m.Options, []string{"rbind", "rw"}) {
				t.Errorf("%s: mount %+v", tc.uid, m)
			}
			got[m.ContainerPath] = m.HostPath
		}
		if !maps.Equal(got, map[string]string{"/run/resclass/mps/GPU-m/pipe": testMPSDir + "/GPU-m/pipe", "/dev/shm": testMPSDir + "/shm"}) {
			t.Errorf("%s: mounts %v", tc.uid, got)
		}
	}
	// What the runtime makes of each claim's CDI device: its own limits and
	// the MPS mounts.
	for uid, want := range map[string]string{"u1": "0=10240M", "u22": "0=20480M"} {
		spec := f.containerSpec(claimCDI(uid, "gpus"))
		env := map[string]string{}
		for _, kv := range spec.Process.Env {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		if env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != want {
			t.Errorf("%s's container: memory limit %q, want %q", uid, env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], want)
		}
		mounts := map[string]string{}
		for _, m := range spec.Mounts {
			mounts[m.Destination] = m.Source
		}
		if mounts["/dev/shm"] != testMPSDir+"/shm" || mounts["/run/resclass/mps/GPU-m/pipe"] != testMPSDir+"/GPU-m/pipe" {
			t.Errorf("%s's container mounts %v", uid, mounts)
		}
	}
	prepared := f.p.Prepared()
	if s := prepared["u1"].Devices[0].Share; !maps.Equal(s, assignment.Share{"memory": 10 << 30, "compute": 25}) {
		t.Errorf("u1's share recorded as %v", s)
	}

	// A third share that does not fit beside them is refused; one that
	// does is prepared; the GPU is not given whole beside them.
	if r := f.prepare(shareClaim("u333", "gpu-m", "s/memory", "11Gi", "s/compute", "20", "memory", "0"))["u333"]; r.Err == nil || !strings.Contains(r.Err.Error(), "more than its 42949672960 of memory") {
		t.Errorf("a share beyond the GPU's memory: %v", r.Err)
	}
	if r := f.prepare(shareClaim("u4444", "gpu-m", "s/memory", "9Gi", "s/compute", "25", "memory", "0"))["u4444"]; r.Err != nil {
		t.Errorf("a share that fits: %v", r.Err)
	}
	if r := f.prepare(claim("u5", "any", "gpu-m"))["u5"]; r.Err == nil || !strings.Contains(r.Err.Error(), "no share of it") {
		t.Errorf("the shared GPU whole: %v", r.Err)
	}

	// The checkpoint keeps the shares: after a restart the kubelet's
	// repeated prepare gets the same answer, and the capacity taken is
	// still counted.
	f.restart()
	f.cfg.Kinds = nil
	f.p.SetDevices([]v1alpha1.Device{sharedGPU("GPU-m", 0, v1alpha1.SharingMPS, "40Gi", "100")}, map[string]string{"gpu-m": "GPU-m"})
	if r := f.prepare(shareClaim("u1", "gpu-m", "s/memory", "10Gi", "s/compute", "25", "memory", "0"))["u1"]; r.Err != nil {
		t.Errorf("repeated prepare after a restart: %v", r.Err)
	}
	if r := f.prepare(shareClaim("u666666", "gpu-m", "s/compute", "1", "s/memory", "1Mi"))["u666666"]; r.Err == nil || !strings.Contains(r.Err.Error(), "of compute") {
		t.Errorf("a share beyond the GPU's compute after a restart: %v", r.Err)
	}
}

func TestPrepareShareTimeSlicedAndMemoryOnly(t *testing.T) {
	f := newShareFixture(t)
	res := f.prepare(
		shareClaim("u1", "gpu-t", "s/memory", "8Gi", "s/compute", "0", "memory", "0"),
		shareClaim("u22", "gpu-o", "s/memory", "3Gi", "memory", "0"),
	)
	for uid, r := range res {
		if r.Err != nil {
			t.Fatalf("%s: %v", uid, r.Err)
		}
	}
	env, mounts := edits(t, f.spec("u1"))
	if env["RESCLASS_SHARE_MEMORY"] != "8589934592" || len(mounts) != 0 {
		t.Errorf("time-sliced share: env %v, mounts %v", env, mounts)
	}
	for _, k := range []string{"RESCLASS_SHARE_COMPUTE", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"} {
		if v, ok := env[k]; ok {
			t.Errorf("time-sliced share of no compute: %s=%s", k, v)
		}
	}
	env, mounts = edits(t, f.spec("u22"))
	if env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=3072M" || len(mounts) != 2 {
		t.Errorf("memory-only MPS share: env %v, mounts %v", env, mounts)
	}
	if v, ok := env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]; ok {
		t.Errorf("memory-only MPS share has a thread limit %s", v)
	}
}

func TestPrepareRefusesBadConsumedCapacity(t *testing.T) {
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		why   string
	}{
		{"negative", shareClaim("u", "gpu-m", "s/memory", "-1Gi", "s/compute", "25", "memory", "0"), "not a whole number from 0 to the device's 42949672960"},
		{"a fraction", shareClaim("u", "gpu-m", "s/memory", "1Gi", "s/compute", "0.5", "memory", "0"), "not a whole number"},
		{"huge", shareClaim("u", "gpu-m", "s/memory", "1e30", "s/compute", "25", "memory", "0"), "not a whole number"},
		{"above the capacity", shareClaim("u", "gpu-m", "s/memory", "41Gi", "s/compute", "25", "memory", "0"), "from 0 to the device's 42949672960"},
		{"compute above 100", shareClaim("u", "gpu-m", "s/memory", "1Gi", "s/compute", "101", "memory", "0"), "from 0 to the device's 100"},
		{"memory absent", shareClaim("u", "gpu-m", "s/compute", "25", "memory", "0"), "has no share.resclass.io/memory"},
		{"nothing consumed", claim("u", "gpu-share", "gpu-m"), "allocated no share"},
		{"nothing taken", shareClaim("u", "gpu-m", "s/memory", "0", "s/compute", "0", "memory", "0"), "takes no share"},
		{"the GPU's own memory", shareClaim("u", "gpu-m", "s/memory", "1Gi", "s/compute", "1", "memory", "1Gi"), "consumedCapacity memory is 1Gi"},
		{"a share of a whole GPU", shareClaim("u", "gpu-0", "s/memory", "1Gi"), "served whole now"},
		{"too many entries", func() *resourceapi.ResourceClaim {
			c := shareClaim("u", "gpu-m", "s/memory", "1Gi", "s/compute", "1")
			for i := range maxConsumed {
				c.Status.Allocation.Devices.Results[0].ConsumedCapacity[resourceapi.QualifiedName(fmt.Sprintf("c%d", i))] = resource.MustParse("0")
			}
			return c
		}(), "entries"},
		{"two devices in one share request", func() *resourceapi.ResourceClaim {
			c := shareClaim("u", "gpu-m", "s/memory", "1Gi", "s/compute", "1")
			r := c.Status.Allocation.Devices.Results[0]
			r.Device = "gpu-t"
			c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, r)
			return c
		}(), "a share is of one device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newShareFixture(t)
			r := f.prepare(tc.claim)["u"]
			if r.Err == nil || !strings.Contains(r.Err.Error(), tc.why) {
				t.Fatalf("got %v, want a refusal saying %q", r.Err, tc.why)
			}
			if len(f.p.Prepared()) != 0 {
				t.Error("a refused claim is prepared")
			}
		})
	}
}

// FuzzReadShare: whatever consumedCapacity a claim's status carries, readShare
// never panics, and a share it accepts is within the device's capacity,
// takes something, and names only memory and compute.
func FuzzReadShare(f *testing.F) {
	f.Add("share.resclass.io/memory", "10Gi", "share.resclass.io/compute", "25", "memory", "0", true)
	f.Add("share.resclass.io/memory", "-1", "share.resclass.io/compute", "1e40", "x", "1", false)
	f.Add("share.resclass.io/memory", "0.5", "share.resclass.io/compute", "100", "memory", "0", true)
	gpus := []v1alpha1.Device{sharedGPU("GPU-m", 0, v1alpha1.SharingMPS, "40Gi", "100"), sharedGPU("GPU-o", 0, v1alpha1.SharingMPS, "1", ""), gpu("GPU-w", 1)}
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string, shareID bool) {
		r := resourceapi.DeviceRequestAllocationResult{Device: "d", ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{}}
		for _, kv := range [][2]string{{k1, v1}, {k2, v2}, {k3, v3}} {
			if q, err := resource.ParseQuantity(kv[1]); err == nil {
				r.ConsumedCapacity[resourceapi.QualifiedName(kv[0])] = q
			}
		}
		if shareID {
			r.ShareID = ptr(types.UID("u"))
		}
		for i := range gpus {
			share, err := readShare(&r, &gpus[i])
			if err != nil || share == nil {
				continue
			}
			c, _ := shareCapacity(&gpus[i])
			if len(share) == 0 || checkShare(share) != nil {
				t.Fatalf("accepted %v", share)
			}
			for name, v := range share {
				limit := map[string]int64{"memory": c.Memory, "compute": c.Compute}[name]
				if v <= 0 || v > limit {
					t.Fatalf("%s: accepted %s %d of %d", gpus[i].ID, name, v, limit)
				}
			}
		}
	})
}

// The checkpoint takes a device in several claims only as shares, and shares
// only within their bounds.
func TestCheckpointShares(t *testing.T) {
	dev := func(share assignment.Share) PreparedDevice {
		return PreparedDevice{Request: "r", Pool: "node", Device: "gpu-m", ID: "GPU-m", Share: share}
	}
	two := func(a, b assignment.Share) *Checkpoint {
		return &Checkpoint{Claims: map[types.UID]PreparedClaim{
			"u1": {Namespace: "ns", Name: "a", Devices: []PreparedDevice{dev(a)}},
			"u2": {Namespace: "ns", Name: "b", Devices: []PreparedDevice{dev(b)}},
		}}
	}
	for _, tc := range []struct {
		name string
		cp   *Checkpoint
		why  string
	}{
		{"two shares", two(assignment.Share{"memory": 1 << 30}, assignment.Share{"compute": 50}), ""},
		{"a share and the whole", two(assignment.Share{"memory": 1 << 30}, nil), "not as shares"},
		{"the whole and a share", two(nil, assignment.Share{"memory": 1 << 30}), "not as shares"},
		{"compute above 100", two(assignment.Share{"compute": 101}, assignment.Share{"compute": 1}), "not from 1 to 100"},
		{"memory above 1Ei", two(assignment.Share{"memory": v1alpha1.MaxShareMemoryBytes + 1}, assignment.Share{"compute": 1}), "not from 1"},
		{"zero", two(assignment.Share{"memory": 0}, assignment.Share{"compute": 1}), "not from 1"},
		{"another capacity", two(assignment.Share{"bandwidth": 1}, assignment.Share{"compute": 1}), "no share capacity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blob, err := tc.cp.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseCheckpoint(blob)
			switch {
			case tc.why == "" && err != nil:
				t.Fatal(err)
			case tc.why == "" && !maps.Equal(got.Claims["u2"].Devices[0].Share, tc.cp.Claims["u2"].Devices[0].Share):
				t.Errorf("share read back as %v", got.Claims["u2"].Devices[0].Share)
			case tc.why != "" && (err == nil || !strings.Contains(err.Error(), tc.why)):
				t.Errorf("got %v, want a refusal saying %q", err, tc.why)
			}
		})
	}
}

// Holders names the claims prepared on a GPU, shares and whole, so that a
// sharing mode change on a DRA node waits for them.
func TestHolders(t *testing.T) {
	f := newShareFixture(t)
	f.prepare(
		shareClaim("u22", "gpu-m", "s/memory", "1Gi", "s/compute", "1", "memory", "0"),
		shareClaim("u1", "gpu-m", "s/memory", "1Gi", "s/compute", "1", "memory", "0"),
		claim("u3", "any", "gpu-0"),
	)
	want := []handoff.Holder{{Namespace: "ns", Name: "claim-u1", Share: true}, {Namespace: "ns", Name: "claim-u22", Share: true}}
	if got := f.p.Holders("GPU-m"); !slices.Equal(got, want) {
		t.Errorf("holders of GPU-m %v, want %v", got, want)
	}
	if got := f.p.Holders("GPU-a"); !slices.Equal(got, []handoff.Holder{{Namespace: "ns", Name: "claim-u3"}}) {
		t.Errorf("holders of GPU-a %v", got)
	}
	if got := f.p.Holders("GPU-t"); len(got) != 0 {
		t.Errorf("holders of GPU-t %v", got)
	}
}

// A container with two shares of one GPU (one claim of two share requests)
// gets their sum in each request's CDI device, whichever the runtime applies
// last, as the device-plugin path sums a container's share classes.
func TestOneContainerSumsItsShares(t *testing.T) {
	f := newShareFixture(t)
	pod := testPod(corev1.Container{Name: "main", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "c"}}}})
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "c", ResourceClaimName: ptr("claim-uc")}}
	c := podClaim("uc", pod, map[string][]string{"small": {"gpu-m"}, "big": {"gpu-m"}})
	for i := range c.Status.Allocation.Devices.Results {
		r := &c.Status.Allocation.Devices.Results[i]
		memory, compute := "1Gi", "10"
		if r.Request == "r-big" {
			memory, compute = "4Gi", "30"
		}
		r.ShareID = ptr(types.UID(fmt.Sprintf("00000000-0000-0000-0000-00000000000%d", i)))
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
			"share.resclass.io/memory": resource.MustParse(memory), "share.resclass.io/compute": resource.MustParse(compute), "memory": resource.MustParse("0"),
		}
	}
	f.withClient(pod, c)
	setSharedDevices(f)
	if r := f.prepare(c)["uc"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	s := f.spec("uc")
	if len(s.Devices) != 2 {
		t.Fatalf("%d CDI devices", len(s.Devices))
	}
	for _, d := range s.Devices {
		env := map[string]string{}
		for _, kv := range d.ContainerEdits.Env {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		for k, want := range map[string]string{
			"RESCLASS_SHARE_MEMORY":             "5368709120",
			"RESCLASS_SHARE_COMPUTE":            "40",
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  "0=5120M",
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40",
		} {
			if env[k] != want {
				t.Errorf("%s: %s=%q, want %q", d.Name, k, env[k], want)
			}
		}
	}
}
