package mig

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/resclass/resclass/pkg/internal/watchdog"
)

func owned(gpu string, start int, gi uint32, pod string) Owned {
	return Owned{GPU: gpu, Profile: "1g.10gb", Start: start, GPUInstance: gi, Pod: pod}
}

func TestRecordRoundTripAndRefusals(t *testing.T) {
	r := &Record{Instances: []Owned{owned("GPU-a", 0, 3, "uid-1"), owned("GPU-a", 1, 4, "uid-2"), owned("GPU-b", 0, 3, "uid-3")}}
	r.Instances[0].Device = "MIG-1"
	blob, err := r.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseRecord(blob)
	if err != nil || fmt.Sprint(got.Instances) != fmt.Sprint(r.Instances) {
		t.Fatalf("round trip: %v, %+v", err, got)
	}
	empty, err := (&Record{}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ParseRecord(empty); err != nil || len(got.Instances) != 0 {
		t.Fatalf("empty record: %v, %+v", err, got)
	}
	for _, bad := range []struct {
		what string
		blob []byte
		want string
	}{
		{"an edit", bytes.Replace(blob, []byte("uid-2"), []byte("uid-9"), 1), "checksum"},
		{"another version", bytes.Replace(blob, []byte("mig-owned/v1"), []byte("mig-owned/v9"), 1), "version"},
		{"an unknown field", []byte(`{"version":"resclass.io/mig-owned/v1","checksum":"","data":{},"x":1}`), "unknown field"},
		{"too large", make([]byte, MaxRecordBytes+1), "bytes, at most"},
	} {
		if _, err := ParseRecord(bad.blob); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want an error saying %q", bad.what, err, bad.want)
		}
	}
	for _, bad := range []struct {
		what string
		r    Record
	}{
		{"one start twice", Record{Instances: []Owned{owned("GPU-a", 0, 3, "p"), owned("GPU-a", 0, 4, "q")}}},
		{"one instance id twice", Record{Instances: []Owned{owned("GPU-a", 0, 3, "p"), owned("GPU-a", 1, 3, "q")}}},
		{"a start past the slices", Record{Instances: []Owned{owned("GPU-a", 8, 3, "p")}}},
		{"no pod", Record{Instances: []Owned{owned("GPU-a", 0, 3, "")}}},
		{"a control character", Record{Instances: []Owned{owned("GPU-a\n", 0, 3, "p")}}},
	} {
		if _, err := bad.r.Marshal(); err == nil {
			t.Errorf("%s: marshalled", bad.what)
		}
	}
}

// TestReconcile: after a restart the record's instances that exist and
// whose pod is live stay, those no pod holds are destroyed, those gone are
// forgotten, and instances the agent did not create (not in the record, or
// in a recorded place with another id or profile) are never named.
func TestReconcile(t *testing.T) {
	r := &Record{Instances: []Owned{
		owned("GPU-a", 0, 1, "live"),
		owned("GPU-a", 1, 2, "gone-pod"),
		owned("GPU-a", 2, 3, "live"), // destroyed behind our back
		owned("GPU-b", 0, 1, "live"), // someone else's instance took its place: id 7
	}}
	existing := []Existing{
		{"GPU-a", "1g.10gb", 0, 1}, {"GPU-a", "1g.10gb", 1, 2}, {"GPU-a", "1g.10gb", 5, 9},
		{"GPU-b", "1g.10gb", 0, 7},
	}
	keep, destroy, forget := Reconcile(r, existing, func(pod string) bool { return pod == "live" })
	if fmt.Sprint(keep) != fmt.Sprint([]Owned{r.Instances[0]}) || fmt.Sprint(destroy) != fmt.Sprint([]Owned{r.Instances[1]}) ||
		fmt.Sprint(forget) != fmt.Sprint([]Owned{r.Instances[2], r.Instances[3]}) {
		t.Errorf("keep %v\ndestroy %v\nforget %v", keep, destroy, forget)
	}
}

// FuzzParseRecord: any bytes are refused or read into a record that
// Marshal writes back and ParseRecord reads the same, within the bounds.
func FuzzParseRecord(f *testing.F) {
	r := &Record{Instances: []Owned{owned("GPU-a", 0, 3, "uid-1")}}
	blob, err := r.Marshal()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(blob)
	f.Add([]byte(`{"version":"resclass.io/mig-owned/v1","checksum":"x","data":{"instances":[]}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		watchdog.Run(t, func() {
			got, err := ParseRecord(b)
			if err != nil {
				return
			}
			if len(got.Instances) > maxOwned {
				t.Fatalf("%d instances", len(got.Instances))
			}
			again, err := got.Marshal()
			if err != nil {
				t.Fatalf("a record read cannot be written: %v", err)
			}
			back, err := ParseRecord(again)
			if err != nil || fmt.Sprint(back.Instances) != fmt.Sprint(got.Instances) {
				t.Fatalf("written and read again: %v, %+v", err, back)
			}
		})
	})
}
