package hugepages

import (
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/internal/watchdog"
)

// tree builds a fake host root.
type tree struct {
	t    *testing.T
	root string
}

func newTree(t *testing.T) *tree { return &tree{t: t, root: t.TempDir()} }

func (tr *tree) dir(path string) *tree {
	tr.t.Helper()
	if err := os.MkdirAll(filepath.Join(tr.root, path), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	return tr
}

func (tr *tree) file(path, content string) *tree {
	tr.t.Helper()
	tr.dir(filepath.Dir(path))
	if err := os.WriteFile(filepath.Join(tr.root, path), []byte(content), 0o644); err != nil {
		tr.t.Fatal(err)
	}
	return tr
}

// pool writes a pool directory with the counters the kernel keeps there.
func (tr *tree) pool(dir string, total, free int) *tree {
	tr.file(dir+"/nr_hugepages", strconv.Itoa(total)+"\n")
	tr.file(dir+"/free_hugepages", strconv.Itoa(free)+"\n")
	return tr.file(dir+"/surplus_hugepages", "0\n")
}

const (
	node0 = "sys/devices/system/node/node0/hugepages/"
	node1 = "sys/devices/system/node/node1/hugepages/"
	mm    = "sys/kernel/mm/hugepages/"
)

func discover(t *testing.T, root string) []v1alpha1.Device {
	t.Helper()
	devs, err := Discover(Options{HostRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	return devs
}

func ids(devs []v1alpha1.Device) []string {
	out := []string{}
	for _, d := range devs {
		out = append(out, d.ID)
	}
	return out
}

// attrs renders a device's attributes as strings, and checks each well-known one
// has the type the API promises.
func attrs(t *testing.T, d v1alpha1.Device) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, a := range d.Attributes {
		if wk := WellKnown(name); wk == "" || a.Type() != wk {
			t.Errorf("%s: %s published as %s, the contract says %q", d.ID, name, a.Type(), wk)
		}
		out[name] = a.String()
	}
	return out
}

// A two-node machine with 2Mi and 1Gi pages, and the entries a real sysfs has
// around the pools (files, memoryless nodes, a page size the kernel will never
// write) that must be skipped without failing.
func numaFixture(t *testing.T) string {
	tr := newTree(t).
		pool(node0+"hugepages-2048kB", 1024, 1000).
		pool(node0+"hugepages-1048576kB", 8, 4).
		pool(node1+"hugepages-2048kB", 512, 512).
		pool(node1+"hugepages-1048576kB", 0, 0).
		// The machine-wide counters, ignored when there are per-node ones.
		pool(mm+"hugepages-2048kB", 1536, 1512).
		pool(mm+"hugepages-1048576kB", 8, 4).
		file("sys/devices/system/node/online", "0-2\n").
		file("sys/devices/system/node/has_cpu", "0-2\n").
		file("sys/devices/system/node/node3", "not a directory\n").
		dir("sys/devices/system/node/node2/cpu4"). // memoryless: no hugepages directory
		dir("sys/devices/system/node/power").
		dir("sys/devices/system/node/nodeX/hugepages/hugepages-2048kB").
		dir("sys/devices/system/node/node01/hugepages/hugepages-2048kB").
		dir(node0+"hugepages-abckB").
		dir(node0+"hugepages-0kB").
		dir(node0+"hugepages-99999999999999999999kB").
		dir(node0+"hugepages-9007199254740992kB"). // in bytes, one kB past int64
		dir(node0+"hugepages-2048KB").
		dir(node0+"hugepages-02048kB").
		dir(node0+"hugepages-2048").
		file(node0+"hugepages-4096kB", "a file, not a pool\n").
		file(node0+"README", "\n")
	return tr.root
}

func TestDiscoverPerNUMANode(t *testing.T) {
	devs := discover(t, numaFixture(t))
	want := []string{"hugepages-1Gi-numa0", "hugepages-1Gi-numa1", "hugepages-2Mi-numa0", "hugepages-2Mi-numa1"}
	if got := ids(devs); !slices.Equal(got, want) {
		t.Fatalf("ids %v, want %v", got, want)
	}
	for i, want := range []map[string]string{
		{"size": "1Gi", "resourceName": "hugepages-1Gi", "numaNode": "0", "pagesTotal": "8", "pagesFree": "4"},
		{"size": "1Gi", "resourceName": "hugepages-1Gi", "numaNode": "1", "pagesTotal": "0", "pagesFree": "0"},
		{"size": "2Mi", "resourceName": "hugepages-2Mi", "numaNode": "0", "pagesTotal": "1024", "pagesFree": "1000"},
		{"size": "2Mi", "resourceName": "hugepages-2Mi", "numaNode": "1", "pagesTotal": "512", "pagesFree": "512"},
	} {
		d := devs[i]
		if d.Kind != v1alpha1.DeviceKindHugePages || !d.Healthy || d.Reason != "" {
			t.Errorf("%s: kind %q healthy %v reason %q; want a healthy huge-pages pool", d.ID, d.Kind, d.Healthy, d.Reason)
		}
		if got := attrs(t, d); !maps.Equal(got, want) {
			t.Errorf("%s: attributes %v, want %v", d.ID, got, want)
		}
	}
}

// Without per-node hugepages directories, the machine-wide counters give one pool
// per size and no NUMA node.
func TestDiscoverMachineWide(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(*tree)
	}{
		{"no node directory", func(*tree) {}},
		{"nodes without hugepages", func(tr *tree) {
			tr.file("sys/devices/system/node/online", "0\n").dir("sys/devices/system/node/node0/cpu0")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTree(t).
				pool(mm+"hugepages-2048kB", 64, 10).
				pool(mm+"hugepages-1048576kB", 2, 2).
				pool(mm+"hugepages-32768kB", 1, 0). // arm64's contiguous-PTE size
				dir(mm + "hugepages-bogus")
			tc.build(tr)
			devs := discover(t, tr.root)
			if got, want := ids(devs), []string{"hugepages-1Gi", "hugepages-2Mi", "hugepages-32Mi"}; !slices.Equal(got, want) {
				t.Fatalf("ids %v, want %v", got, want)
			}
			want := map[string]string{"size": "2Mi", "resourceName": "hugepages-2Mi", "pagesTotal": "64", "pagesFree": "10"}
			if got := attrs(t, devs[1]); !maps.Equal(got, want) || !devs[1].Healthy {
				t.Errorf("%s: attributes %v healthy %v, want %v and healthy", devs[1].ID, got, devs[1].Healthy, want)
			}
		})
	}
}

// A pool whose counters cannot be read stays listed, unhealthy, naming the file;
// the counter that can be read is still published.
func TestDiscoverUnreadableCounters(t *testing.T) {
	const pool = node0 + "hugepages-2048kB"
	for _, tc := range []struct {
		name        string
		total, free *string // nil: file missing
		reason      string
		want        map[string]string
	}{
		{
			name: "free missing", total: ptr("16\n"),
			reason: "cannot read free_hugepages in /" + pool,
			want:   map[string]string{"pagesTotal": "16"},
		},
		{
			name: "total truncated", total: ptr(""), free: ptr("3\n"),
			reason: "cannot read nr_hugepages in /" + pool,
			want:   map[string]string{"pagesFree": "3"},
		},
		{
			name: "garbage", total: ptr("sixteen\n"), free: ptr("1"),
			reason: "cannot read nr_hugepages in /" + pool,
			want:   map[string]string{"pagesFree": "1"},
		},
		{
			name: "negative", total: ptr("16\n"), free: ptr("-1\n"),
			reason: "cannot read free_hugepages in /" + pool,
			want:   map[string]string{"pagesTotal": "16"},
		},
		{
			name:   "both missing",
			reason: "cannot read nr_hugepages, free_hugepages in /" + pool,
			want:   map[string]string{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTree(t).dir(pool).pool(node0+"hugepages-1048576kB", 1, 1)
			if tc.total != nil {
				tr.file(pool+"/nr_hugepages", *tc.total)
			}
			if tc.free != nil {
				tr.file(pool+"/free_hugepages", *tc.free)
			}
			devs := discover(t, tr.root)
			if got := ids(devs); !slices.Equal(got, []string{"hugepages-1Gi-numa0", "hugepages-2Mi-numa0"}) {
				t.Fatalf("ids %v: the unreadable pool must stay listed", got)
			}
			if !devs[0].Healthy {
				t.Errorf("the readable pool is unhealthy: %s", devs[0].Reason)
			}
			d := devs[1]
			if d.Healthy || d.Reason != tc.reason {
				t.Errorf("healthy %v reason %q, want unhealthy with %q", d.Healthy, d.Reason, tc.reason)
			}
			if len(d.Reason) > 256 {
				t.Errorf("reason is %d characters, the API allows 256", len(d.Reason))
			}
			got := attrs(t, d)
			for _, name := range []string{"pagesTotal", "pagesFree"} {
				if got[name] != tc.want[name] {
					t.Errorf("%s = %q, want %q", name, got[name], tc.want[name])
				}
			}
			if got["size"] != "2Mi" || got["numaNode"] != "0" {
				t.Errorf("size and NUMA node must not depend on the counters: %v", got)
			}
		})
	}
}

func ptr(s string) *string { return &s }

// A kernel without hugetlbfs has no hugepage directories: zero pools, no error.
// A host root that does not exist is a misconfigured mount, which zero pools
// would hide: an error.
func TestDiscoverNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(*tree)
	}{
		{"empty root", func(*tree) {}},
		{"empty sysfs", func(tr *tree) { tr.dir("sys") }},
		{"no sizes", func(tr *tree) { tr.dir(node0).dir(node1).dir(mm) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTree(t)
			tc.build(tr)
			devs, err := Discover(Options{HostRoot: tr.root})
			if err != nil || len(devs) != 0 {
				t.Errorf("got %v, %v; want no pools and no error", ids(devs), err)
			}
		})
	}
	if devs, err := Discover(Options{HostRoot: filepath.Join(t.TempDir(), "missing")}); err == nil {
		t.Errorf("a missing host root gave %v and no error", ids(devs))
	}
}

func TestParsePageDir(t *testing.T) {
	for name, want := range map[string]string{
		"hugepages-64kB":       "64Ki", // arm64 with 4k pages, contiguous PTEs
		"hugepages-2048kB":     "2Mi",
		"hugepages-32768kB":    "32Mi",
		"hugepages-524288kB":   "512Mi", // arm64 with 64k pages
		"hugepages-1048576kB":  "1Gi",
		"hugepages-16777216kB": "16Gi", // ppc64
		"hugepages-1536kB":     "1536Ki",
	} {
		bytes, ok := parsePageDir(name)
		if got := sizeName(bytes); !ok || got != want {
			t.Errorf("parsePageDir(%q) = %d, %v: size %q, want %q", name, bytes, ok, got, want)
		}
	}
	for _, bad := range []string{
		"hugepages-abckB", "hugepages-0kB", "hugepages-kB", "hugepages-2048KB", "hugepages-2MB", "hugepages-2048",
		"hugepages-02048kB", "hugepages-+2048kB", "hugepages--2048kB", "hugepages-2048 kB", "hugepages-2048kB\n",
		"hugepages-99999999999999999999kB", "hugepages-9007199254740992kB", "hugepages_2048kB", "2048kB", "",
	} {
		if bytes, ok := parsePageDir(bad); ok {
			t.Errorf("parsePageDir(%q) accepted as %d bytes", bad, bytes)
		}
	}
}

// FuzzParsePageDir: whatever a directory is called, an accepted name is the
// kernel's spelling of its size (so two names never make one pool id), and the
// size gives a kubelet resource name that parses back to the same bytes and a
// pool id the NodeDevices API accepts.
func FuzzParsePageDir(f *testing.F) {
	for _, s := range []string{
		"hugepages-2048kB", "hugepages-1048576kB", "hugepages-64kB", "hugepages-1536kB",
		"hugepages-2048KB", "hugepages-2MB", "hugepages-1GiB", "hugepages-2048", "hugepages-20", "hugepages-",
		"hugepages-0kB", "hugepages-02048kB", "hugepages-+1kB", "hugepages--1kB", "hugepages-1e3kB",
		"hugepages-9007199254740991kB", "hugepages-9007199254740992kB", "hugepages-99999999999999999999kB",
		"hugepages-2048kB\n", "hugepages-٣kB", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		watchdog.Run(t, func() {
			bytes, ok := parsePageDir(name)
			if !ok {
				return
			}
			if bytes <= 0 || bytes%1024 != 0 {
				t.Fatalf("%q: %d bytes is not a positive number of kB", name, bytes)
			}
			if again := "hugepages-" + strconv.FormatInt(bytes/1024, 10) + "kB"; again != name {
				t.Fatalf("%q accepted, but the kernel writes %d bytes as %q", name, bytes, again)
			}
			size := sizeName(bytes)
			q, err := resource.ParseQuantity(size)
			if err != nil || q.Value() != bytes {
				t.Fatalf("%q: size %q reads back as %v, %v; want %d bytes", name, size, q.Value(), err, bytes)
			}
			if errs := validation.IsQualifiedName("hugepages-" + size); len(errs) > 0 {
				t.Fatalf("%q: resource name hugepages-%s: %v", name, size, errs)
			}
			if id := poolID(bytes, 1023); len(id) > 128 || strings.ContainsAny(id, " /\n") {
				t.Fatalf("%q: pool id %q is not a valid device id", name, id)
			}
		})
	})
}

// TestThisMachine discovers this machine's real pools and checks them against the
// kernel's machine-wide counters: every size the kernel lists has pools, and the
// pools of a size hold the machine's pages of that size.
func TestThisMachine(t *testing.T) {
	devs := discover(t, "/")
	entries, err := os.ReadDir("/" + mm)
	if os.IsNotExist(err) {
		if len(devs) != 0 {
			t.Errorf("no /%s, yet pools %v", mm, ids(devs))
		}
		// A kernel without hugetlbfs: no pools is the whole answer.
		t.Logf("no /%s: this kernel has no hugetlbfs, and no pools were reported", mm)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	total := map[string]int64{}
	for _, d := range devs {
		a := attrs(t, d)
		t.Logf("%s healthy=%v %v", d.ID, d.Healthy, a)
		if !d.Healthy {
			t.Errorf("%s unhealthy on a real machine: %s", d.ID, d.Reason)
			continue
		}
		total[a["size"]] += *d.Attributes[v1alpha1.AttributePagesTotal].IntValue
	}
	for _, e := range entries {
		bytes, ok := parsePageDir(e.Name())
		if !ok {
			t.Errorf("the kernel lists %s, which parsePageDir refuses", e.Name())
			continue
		}
		size := sizeName(bytes)
		want, ok := readInt(t, "/"+mm+e.Name()+"/nr_hugepages")
		if !ok {
			continue
		}
		got, listed := total[size]
		if !listed {
			t.Errorf("the kernel lists %s, no pool has size %s", e.Name(), size)
		} else if got != want {
			t.Errorf("pools of size %s hold %d pages, the kernel's nr_hugepages says %d", size, got, want)
		}
		delete(total, size)
	}
	if len(total) > 0 {
		t.Errorf("pools of sizes the kernel does not list: %v", total)
	}
}

func readInt(t *testing.T, path string) (int64, bool) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("%v", err)
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		t.Errorf("%s: %v", path, err)
	}
	return n, err == nil
}

// FuzzParseNodeDir: an accepted name is the kernel's spelling of a NUMA node
// ("node<N>", no sign, no leading zero), N fits an int32, and the pool id it
// makes is one the NodeDevices API accepts.
func FuzzParseNodeDir(f *testing.F) {
	for _, s := range []string{"node0", "node1", "node07", "node-1", "node+1", "node", "node2147483647", "node2147483648", "node1e9", "node٣", "nodes", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		watchdog.Run(t, func() {
			n, ok := parseNodeDir(name)
			if !ok {
				return
			}
			if n < 0 || n > math.MaxInt32 || "node"+strconv.FormatInt(n, 10) != name {
				t.Fatalf("%q accepted as node %d", name, n)
			}
			if id := poolID(1<<30, n); len(id) > 128 {
				t.Fatalf("pool id %q is longer than the API allows", id)
			}
		})
	})
}
