package draplugin

import (
	"bytes"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/internal/watchdog"
)

// FuzzParseCheckpoint feeds ParseCheckpoint arbitrary bytes: it never panics
// or hangs, and what it accepts is within the bounds and renders back to a
// checkpoint that parses to the same claims.
func FuzzParseCheckpoint(f *testing.F) {
	good := &Checkpoint{Claims: map[types.UID]PreparedClaim{"u1": {Namespace: "ns", Name: "c", Devices: []PreparedDevice{{Request: "r", Pool: "node", Device: "gpu-0", ID: "GPU-a", CDIDeviceIDs: []string{"resclass.io/claim=u1-r"}}}}}}
	blob, err := good.Marshal()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(blob)
	shared := &Checkpoint{Claims: map[types.UID]PreparedClaim{
		"u1": {Namespace: "ns", Name: "a", Devices: []PreparedDevice{{Request: "r", Pool: "node", Device: "gpu-m", ID: "GPU-m", Share: assignment.Share{"memory": 1 << 30, "compute": 25}}}},
		"u2": {Namespace: "ns", Name: "b", Devices: []PreparedDevice{{Request: "r", Pool: "node", Device: "gpu-m", ID: "GPU-m", Share: assignment.Share{"compute": 75}}}},
	}}
	if blob, err = shared.Marshal(); err != nil {
		f.Fatal(err)
	}
	f.Add(blob)
	f.Add([]byte(`{"version":"resclass.io/dra-checkpoint/v1","checksum":"","data":null}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, in []byte) {
		watchdog.Run(t, func() {
			cp, err := ParseCheckpoint(in)
			if err != nil {
				return
			}
			if len(cp.Claims) > maxClaims {
				t.Fatalf("%d claims accepted", len(cp.Claims))
			}
			out, err := cp.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			again, err := ParseCheckpoint(out)
			if err != nil {
				t.Fatalf("an accepted checkpoint does not parse once rendered: %v", err)
			}
			out2, _ := again.Marshal()
			if !bytes.Equal(out, out2) {
				t.Fatal("rendering is not stable")
			}
		})
	})
}
