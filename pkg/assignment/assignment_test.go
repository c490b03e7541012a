package assignment

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/resclass/resclass/pkg/internal/watchdog"
)

const (
	gpuA = "GPU-4b8a2f3c-1e2d-4c5b-9a8f-0123456789ab"
	gpuB = "GPU-9c1d7e6f-2a3b-4c5d-8e9f-fedcba987654"
	nic  = "0000:3b:00.0"
)

func sample() *Assignment {
	return &Assignment{
		Node: "gpu-node-7",
		Containers: []Container{
			{Name: "train", Classes: map[string][]string{
				"nvidia.high.mem": {gpuB, gpuA},
				"hugepages":       {"hugepages-1Gi-numa0"},
			}},
			{Name: "setup", Init: true, Classes: map[string][]string{"fast.nic": {nic}}},
		},
	}
}

func TestEncodeFormat(t *testing.T) {
	got, err := Encode(sample())
	if err != nil {
		t.Fatal(err)
	}
	want := `{"node":"gpu-node-7","containers":[` +
		`{"name":"train","classes":{"hugepages":["hugepages-1Gi-numa0"],"nvidia.high.mem":["` + gpuB + `","` + gpuA + `"]}},` +
		`{"name":"setup","init":true,"classes":{"fast.nic":["` + nic + `"]}}]}`
	if got != want {
		t.Errorf("Encode:\n got %s\nwant %s", got, want)
	}
}

func TestRoundTrip(t *testing.T) {
	for name, a := range map[string]*Assignment{
		"sample":     sample(),
		"one device": {Node: "n", Containers: []Container{{Name: "c", Classes: map[string][]string{"x": {"d"}}}}},
		// The kubelet reuses an init container's devices, and a hugepage pool
		// serves several containers.
		"device in two containers": {Node: "n", Containers: []Container{
			{Name: "i", Init: true, Classes: map[string][]string{"x": {"d"}}},
			{Name: "c", Classes: map[string][]string{"x": {"d"}}},
		}},
		"unicode and <&>": {Node: "n", Containers: []Container{{Name: "c", Classes: map[string][]string{"x": {"gpu-é<&>\"\\"}}}}},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := Encode(a)
			if err != nil {
				t.Fatal(err)
			}
			again, err := Encode(a)
			if err != nil {
				t.Fatal(err)
			}
			if s != again {
				t.Errorf("Encode is not deterministic:\n%s\n%s", s, again)
			}
			got, err := Decode(s)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(a, got); diff != "" {
				t.Errorf("Decode(Encode(a)) differs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	// container wraps one container's JSON into an otherwise valid document.
	container := func(c string) string { return `{"node":"n","containers":[` + c + `]}` }
	long := strings.Repeat("a", 64)
	for _, tc := range []struct {
		name, in, want string
	}{
		{"empty string", ``, "malformed assignment"},
		{"not an object", `[]`, "malformed assignment"},
		{"null", `null`, "node: Required value"},
		{"truncated", `{"node":"n","containers":[{"name":"c","classes":{"x":["d"]}}`, "malformed assignment"},
		{"trailing data", container(`{"name":"c","classes":{"x":["d"]}}`) + `{}`, "after top-level value"},
		{"unknown top-level field", `{"node":"n","extra":1,"containers":[{"name":"c","classes":{"x":["d"]}}]}`, `unknown field "extra"`},
		{"unknown container field", container(`{"name":"c","devices":[],"classes":{"x":["d"]}}`), `unknown field "containers[0].devices"`},
		{"wrong case field", `{"Node":"n","containers":[{"name":"c","classes":{"x":["d"]}}]}`, `unknown field "Node"`},
		{"duplicate field", `{"node":"n","node":"m","containers":[{"name":"c","classes":{"x":["d"]}}]}`, `duplicate field "node"`},
		{"duplicate class key", container(`{"name":"c","classes":{"x":["d"],"x":["e"]}}`), `duplicate field`},
		{"wrong type", `{"node":7,"containers":[]}`, "malformed assignment"},
		{"too big", `{"node":"` + strings.Repeat("n", MaxEncodedSize) + `"}`, "more than the 65536 allowed"},
		{"empty node", `{"node":"","containers":[{"name":"c","classes":{"x":["d"]}}]}`, "node: Required value"},
		{"invalid node", `{"node":"Node_1","containers":[{"name":"c","classes":{"x":["d"]}}]}`, `node: Invalid value: "Node_1"`},
		{"no containers", `{"node":"n","containers":[]}`, "containers: Required value"},
		{"missing containers", `{"node":"n"}`, "containers: Required value"},
		{"null container", container(`null`), "containers[0].name: Required value"},
		{"empty container name", container(`{"name":"","classes":{"x":["d"]}}`), "containers[0].name: Required value"},
		{"invalid container name", container(`{"name":"a.b","classes":{"x":["d"]}}`), `containers[0].name: Invalid value: "a.b"`},
		{"duplicate container name", container(`{"name":"c","classes":{"x":["d"]}},{"name":"c","classes":{"y":["e"]}}`), `containers[1].name: Duplicate value: "c"`},
		{"init and regular container share a name", container(`{"name":"c","classes":{"x":["d"]}},{"name":"c","init":true,"classes":{"y":["e"]}}`), `containers[1].name: Duplicate value: "c"`},
		{"no classes", container(`{"name":"c","classes":{}}`), "containers[0].classes: Required value"},
		{"null classes", container(`{"name":"c"}`), "containers[0].classes: Required value"},
		{"empty class name", container(`{"name":"c","classes":{"":["d"]}}`), "containers[0].classes: Required value"},
		{"invalid class name", container(`{"name":"c","classes":{"Fast_NIC":["d"]}}`), `containers[0].classes: Invalid value: "Fast_NIC"`},
		{"class name too long", container(`{"name":"c","classes":{"` + long + `":["d"]}}`), "containers[0].classes: Too long"},
		{"empty device list", container(`{"name":"c","classes":{"x":[]}}`), `containers[0].classes["x"]: Required value: empty device list`},
		{"null device list", container(`{"name":"c","classes":{"x":null}}`), `containers[0].classes["x"]: Required value: empty device list`},
		{"empty device id", container(`{"name":"c","classes":{"x":["d"]}},{"name":"e","classes":{"fast.nic":[""]}}`), `containers[1].classes["fast.nic"][0]: Required value: empty device id`},
		{"device id too long", container(`{"name":"c","classes":{"x":["d","` + strings.Repeat("d", 129) + `"]}}`), `containers[0].classes["x"][1]: Too long`},
		{"unprintable device id", container(`{"name":"c","classes":{"x":["a\u2028b"]}}`), `containers[0].classes["x"][0]: Invalid value`},
		{"invalid UTF-8", container(`{"name":"c","classes":{"x":["a` + "\xff" + `"]}}`), "not valid UTF-8"},
		{"device twice in a class", container(`{"name":"c","classes":{"x":["d","d"]}}`), `containers[0].classes["x"][1]: Duplicate value: "d": device already given at containers[0].classes["x"][0]`},
		{"device in two classes", container(`{"name":"c","classes":{"x":["d"],"y":["d"]}}`), `containers[0].classes["y"][0]: Duplicate value: "d"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := Decode(tc.in)
			if err == nil {
				t.Fatalf("Decode accepted %s as %+v", tc.in, a)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Decode error %q does not mention %q", err, tc.want)
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	err := Validate(&Assignment{Containers: []Container{{Name: "c", Classes: map[string][]string{"x": {""}}}}})
	for _, want := range []string{"node: Required value", `containers[0].classes["x"][0]: Required value`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error %v does not mention %q", err, want)
		}
	}
	if err := Validate(nil); err == nil {
		t.Error("Validate(nil) succeeded")
	}
}

func TestEncodeRejects(t *testing.T) {
	bad := sample()
	bad.Containers[0].Classes["fast.nic"] = []string{gpuA}
	if _, err := Encode(bad); err == nil || !strings.Contains(err.Error(), `containers[0].classes["nvidia.high.mem"][1]: Duplicate value`) {
		t.Errorf("Encode of a doubly given device: error %v", err)
	}
	if _, err := Annotations(bad); err == nil {
		t.Error("Annotations of a doubly given device succeeded")
	}

	if _, err := Encode(&Assignment{Node: "n", Containers: []Container{{Name: "c", Classes: map[string][]string{"x": {"a\xff"}}}}}); err == nil ||
		!strings.Contains(err.Error(), `containers[0].classes["x"][0]: Invalid value`) {
		t.Errorf("Encode of an id that is not UTF-8: error %v", err)
	}

	// Valid piece by piece, but more than a pod may carry.
	huge := &Assignment{Node: "n", Containers: []Container{{Name: "c", Classes: map[string][]string{"x": nil}}}}
	for i := 0; len(huge.Containers[0].Classes["x"])*MaxDeviceIDLength <= MaxEncodedSize; i++ {
		huge.Containers[0].Classes["x"] = append(huge.Containers[0].Classes["x"], fmt.Sprintf("%0128d", i))
	}
	if _, err := Encode(huge); err == nil || !strings.Contains(err.Error(), "more than the 65536 allowed") {
		t.Errorf("Encode of an oversized assignment: error %v", err)
	}
}

// Whatever Decode accepts must encode within the limit again, even with characters
// that encoding/json would escape by default.
func TestDecodeNearLimitEncodes(t *testing.T) {
	var ids []string
	size := len(`{"node":"n","containers":[{"name":"c","classes":{"x":[]}}]}`)
	for i := 0; size+MaxDeviceIDLength+3 <= MaxEncodedSize; i++ {
		id := fmt.Sprintf("%0120d<&>\\u00e9", i)
		ids = append(ids, `"`+id+`"`)
		size += len(id) + 3
	}
	in := `{"node":"n","containers":[{"name":"c","classes":{"x":[` + strings.Join(ids, ",") + `]}}]}`
	a, err := Decode(in)
	if err != nil {
		t.Fatalf("Decode of %d bytes: %v", len(in), err)
	}
	if _, err := Encode(a); err != nil {
		t.Errorf("Encode after Decode of %d bytes: %v", len(in), err)
	}
}

func TestAccessors(t *testing.T) {
	a := sample()
	if diff := cmp.Diff([]string{gpuB, gpuA}, a.Devices("train", "nvidia.high.mem")); diff != "" {
		t.Errorf("Devices(train, nvidia.high.mem) (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{nic}, a.Devices("setup", "fast.nic")); diff != "" {
		t.Errorf("Devices(setup, fast.nic) (-want +got):\n%s", diff)
	}
	for _, args := range [][2]string{{"train", "fast.nic"}, {"sidecar", "fast.nic"}} {
		if got := a.Devices(args[0], args[1]); got != nil {
			t.Errorf("Devices(%s, %s) = %v, want nil", args[0], args[1], got)
		}
	}
	a.Devices("train", "nvidia.high.mem")[0] = "changed"
	if a.Containers[0].Classes["nvidia.high.mem"][0] != gpuB {
		t.Error("Devices returned the assignment's own slice")
	}
	if diff := cmp.Diff([]string{nic, gpuA, gpuB, "hugepages-1Gi-numa0"}, a.DeviceIDs()); diff != "" {
		t.Errorf("DeviceIDs (-want +got):\n%s", diff)
	}
}

func TestCompatKey(t *testing.T) {
	longClass := "nvidia.a100.sxm4.80gb.high-memory.training" // 42 characters
	for _, tc := range []struct {
		name, class, device string
		want                string // exact key; empty to only check the rules below
		wantPrefix          string
	}{
		{name: "short key kept", class: "nvidia.high.mem", device: "gpu0", want: "scheduler.alpha.kubernetes.io/resClass_nvidia.high.mem_gpu0"},
		{name: "GPU UUID under a short class kept", class: "gpu", device: gpuA, want: CompatKeyPrefix + "gpu_" + gpuA},
		{name: "PCI address sanitized", class: "fast.nic", device: nic, wantPrefix: CompatKeyPrefix + "fast.nic_0000-3b-00.0-"},
		{name: "GPU UUID under a long class cut", class: longClass, device: gpuA, wantPrefix: CompatKeyPrefix + longClass[:20]},
		{name: "empty class and device", class: "", device: "", wantPrefix: CompatKeyPrefix + "_-"},
		{name: "non-ASCII", class: "gpu", device: "карта-0", wantPrefix: CompatKeyPrefix + "gpu_------0-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := CompatKey(tc.class, tc.device)
			if tc.want != "" && got != tc.want {
				t.Errorf("CompatKey(%q, %q) = %q, want %q", tc.class, tc.device, got, tc.want)
			}
			if !strings.HasPrefix(got, tc.wantPrefix) {
				t.Errorf("CompatKey(%q, %q) = %q, want prefix %q", tc.class, tc.device, got, tc.wantPrefix)
			}
			if errs := validation.IsQualifiedName(got); len(errs) > 0 {
				t.Errorf("CompatKey(%q, %q) = %q, not a qualified name: %v", tc.class, tc.device, got, errs)
			}
			if !IsAnnotation(got) {
				t.Errorf("IsAnnotation(%q) = false", got)
			}
		})
	}

	t.Run("ids sharing a long prefix differ", func(t *testing.T) {
		prefix := strings.Repeat("0123456789", 6)
		a, b := CompatKey("gpu", prefix+"-a"), CompatKey("gpu", prefix+"-b")
		if a == b {
			t.Errorf("both ids map to %q", a)
		}
	})
	t.Run("sanitizing alone does not collide", func(t *testing.T) {
		if a, b := CompatKey("fast.nic", "0000:3b:00.0"), CompatKey("fast.nic", "0000-3b-00.0"); a == b {
			t.Errorf("both ids map to %q", a)
		}
	})
}

func TestAnnotations(t *testing.T) {
	got, err := Annotations(sample())
	if err != nil {
		t.Fatal(err)
	}
	structured, err := Encode(sample())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		AnnotationKey:                                     structured,
		CompatKey("nvidia.high.mem", gpuA):                "1",
		CompatKey("nvidia.high.mem", gpuB):                "1",
		CompatKeyPrefix + "hugepages_hugepages-1Gi-numa0": "1",
		CompatKey("fast.nic", nic):                        "1",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Annotations (-want +got):\n%s", diff)
	}
	for k := range got {
		if !IsAnnotation(k) {
			t.Errorf("IsAnnotation(%q) = false", k)
		}
	}
	for _, k := range []string{"resclass.io/resource-content-hash", "scheduler.alpha.kubernetes.io/other", "resclass.io/assignment-old"} {
		if IsAnnotation(k) {
			t.Errorf("IsAnnotation(%q) = true", k)
		}
	}
}

func TestFromPod(t *testing.T) {
	valid, err := Encode(sample())
	if err != nil {
		t.Fatal(err)
	}
	pod := func(annotations map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "trainer-0", Annotations: annotations}}
	}
	for _, tc := range []struct {
		name      string
		pod       *corev1.Pod
		want      *Assignment
		wantFound bool
		wantErr   string
	}{
		{name: "no annotations", pod: pod(nil)},
		{name: "other annotations", pod: pod(map[string]string{CompatKey("gpu", "gpu0"): "1"})},
		{name: "present", pod: pod(map[string]string{AnnotationKey: valid}), want: sample(), wantFound: true},
		{name: "malformed", pod: pod(map[string]string{AnnotationKey: `{"node":"n"`}), wantFound: true, wantErr: "pod ml/trainer-0: annotation resclass.io/assignment: malformed assignment"},
		{name: "invalid", pod: pod(map[string]string{AnnotationKey: `{"node":"n","containers":[]}`}), wantFound: true, wantErr: "pod ml/trainer-0: annotation resclass.io/assignment: invalid assignment: containers: Required value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, found, err := FromPod(tc.pod)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("FromPod: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("FromPod error %v does not mention %q", err, tc.wantErr)
			}
			if found != tc.wantFound {
				t.Errorf("FromPod found = %v, want %v", found, tc.wantFound)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("FromPod (-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	valid, err := Encode(sample())
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		valid,
		valid[:len(valid)/2],
		`{"node":"n","containers":[{"name":"c","classes":{"x":["d"]}}]}`,
		`{"node":"n","containers":[{"name":"c","init":false,"classes":{"x":["d"]}}]} `,
		`{"node":1e999999,"containers":[{"name":123456789012345678901234567890}]}`,
		`{"node":"n","containers":[{"name":"c","classes":{"x":["GPU-é","\u00e9\ud83d\ude00","<&>","\u2028","\ud800"]}}]}`,
		`{"node":"n","containers":[{"name":"c","classes":{"x":["d"],"x":["e"]}}]}`,
		`{"NODE":"n","containers":null}`,
		`{"node":"n","containers":[{"name":"c","classes":{"x":["a\bb","\u0041"]}}]}`,
		`{"node":"n","containers":[{"name":"c","classes":{"x":["d"]},"shares":{"x":{"memory":1073741824,"compute":25}}}]}`,
		`{"node":"n","containers":[{"name":"c","classes":{"x":["d"]},"shares":{"x":{"memory":1e40,"compute":"25"},"y":null}}]}`,
		`{"version":2,"node":"n","containers":[{"name":"c","classes":{"m":["GPU-0/mig/2g.20gb@4","GPU-0/mig/1g.10gb+me@6"]}}]}`,
		`{"version":2,"node":"n","containers":[{"name":"c","classes":{"m":["GPU-0/mig/2g.20gb@9"]}}]}`,
		"\xff\xfe",
		``,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		watchdog.Run(t, func() {
			a, err := Decode(s)
			if err != nil {
				return
			}
			encoded, err := Encode(a)
			if err != nil {
				t.Fatalf("Decode accepted %q but Encode of the result fails: %v", s, err)
			}
			again, err := Decode(encoded)
			if err != nil {
				t.Fatalf("Decode(Encode(x)) fails for %q: %v", encoded, err)
			}
			if diff := cmp.Diff(a, again); diff != "" {
				t.Fatalf("Decode(Encode(x)) differs from x (-x +got):\n%s", diff)
			}
		})
	})
}

func FuzzCompatKey(f *testing.F) {
	f.Add("nvidia.high.mem", "gpu0")
	f.Add("fast.nic", nic)
	f.Add("nvidia.a100.sxm4.80gb.high-memory.training", gpuA)
	f.Add("", "")
	f.Add("a/b", "c/d/e")
	f.Add("ü", "\xff")
	f.Fuzz(func(t *testing.T, class, device string) {
		watchdog.Run(t, func() {
			key := CompatKey(class, device)
			if errs := validation.IsQualifiedName(key); len(errs) > 0 {
				t.Fatalf("CompatKey(%q, %q) = %q, not a qualified name: %v", class, device, key, errs)
			}
			if !strings.HasPrefix(key, CompatKeyPrefix) {
				t.Fatalf("CompatKey(%q, %q) = %q, want prefix %q", class, device, key, CompatKeyPrefix)
			}
			if plain := CompatKeyPrefix + class + "_" + device; len(validation.IsQualifiedName(plain)) == 0 && key != plain {
				t.Fatalf("CompatKey(%q, %q) = %q, want the valid key %q unchanged", class, device, key, plain)
			}
		})
	})
}

// TestShares: a share names one device of its class and known capacities
// within their bounds, and survives a round trip with its amounts.
func TestShares(t *testing.T) {
	share := func(classes map[string][]string, shares map[string]Share) *Assignment {
		return &Assignment{Node: "n", Containers: []Container{{Name: "c", Classes: classes, Shares: shares}}}
	}
	one := map[string][]string{"small": {gpuA}}
	good := share(one, map[string]Share{"small": {"memory": 20 << 30, "compute": 50}})
	s, err := Encode(good)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"shares":{"small":{"compute":50,"memory":21474836480}}`; !strings.Contains(s, want) {
		t.Errorf("Encode: %s lacks %s", s, want)
	}
	back, err := Decode(s)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(good, back); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	for name, tc := range map[string]struct {
		a    *Assignment
		want string
	}{
		"class without device":  {share(one, map[string]Share{"other": {"memory": 1}}), "a share of a class the container has no device of"},
		"two devices":           {share(map[string][]string{"small": {gpuA, gpuB}}, map[string]Share{"small": {"memory": 1}}), "a share is of exactly one device"},
		"empty":                 {share(one, map[string]Share{"small": {}}), "a share takes memory, compute or both"},
		"zero memory":           {share(one, map[string]Share{"small": {"memory": 0}}), "memory must be more than 0"},
		"negative compute":      {share(one, map[string]Share{"small": {"compute": -1}}), "compute must be a percentage from 1 to 100"},
		"compute over 100":      {share(one, map[string]Share{"small": {"compute": 101}}), "compute must be a percentage from 1 to 100"},
		"memory over the bound": {share(one, map[string]Share{"small": {"memory": MaxShareMemory + 1}}), "at most"},
		"unknown capacity":      {share(one, map[string]Share{"small": {"bandwidth": 1}}), `Unsupported value: "bandwidth"`},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Encode(tc.a); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Encode: got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestVersion2: an assignment that gives a MIG slice to create is version
// 2, written so by Encode, and read only as such; every other one stays
// version 1, as agents before slices read it.
func TestVersion2(t *testing.T) {
	slice := &Assignment{Node: "n", Containers: []Container{{Name: "c", Classes: map[string][]string{"mig-20g": {"GPU-0/mig/2g.20gb@4"}}}}}
	s, err := Encode(slice)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"version":2,"node":"n","containers":[{"name":"c","classes":{"mig-20g":["GPU-0/mig/2g.20gb@4"]}}]}`; s != want {
		t.Errorf("encoded %s, want %s", s, want)
	}
	a, err := Decode(s)
	if err != nil || a.Version != 2 || !a.HasSlices() {
		t.Fatalf("decoded %+v, %v", a, err)
	}
	whole := &Assignment{Node: "n", Containers: []Container{{Name: "c", Classes: map[string][]string{"gpu": {"GPU-0"}}}}}
	if s, err := Encode(whole); err != nil || strings.Contains(s, "version") {
		t.Errorf("a version 1 assignment encodes as %s, %v", s, err)
	}
	for what, bad := range map[string]string{
		"a slice in version 1":     `{"node":"n","containers":[{"name":"c","classes":{"m":["GPU-0/mig/2g.20gb@4"]}}]}`,
		"version 2 without slices": `{"version":2,"node":"n","containers":[{"name":"c","classes":{"g":["GPU-0"]}}]}`,
		"a version to come":        `{"version":3,"node":"n","containers":[{"name":"c","classes":{"m":["GPU-0/mig/2g.20gb@4"]}}]}`,
	} {
		if _, err := Decode(bad); err == nil || !strings.Contains(err.Error(), "version") {
			t.Errorf("%s: %v", what, err)
		}
	}
}
