package nvml

import (
	"reflect"
	"testing"
)

// FuzzParseFaults: any content is parsed at bounded cost or refused with an
// error, never a panic; what is accepted is written back and read again as
// it was.
func FuzzParseFaults(f *testing.F) {
	f.Add([]byte(`{"version":1,"bootID":"b","faults":{}}`))
	f.Add([]byte(`{"version":1,"bootID":"3f1c0e52","faults":{"GPU-1":{"reason":"XID 48 (double-bit ECC error)","time":"2026-11-27T19:00:00Z","eccVolatileUncorrected":2}}}`))
	f.Add([]byte(`{"version":1,"bootID":"b","faults":{"GPU-1":{"reason":"XID 79","time":"2026-11-27T19:00:00+02:00"}}}`))
	f.Add([]byte(`{"version":1,"bootID":"b","faults":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		boot, faults, err := ParseFaults(data)
		if err != nil {
			return
		}
		out, err := formatFaults(boot, faults)
		if err != nil {
			t.Fatalf("accepted faults do not format: %v", err)
		}
		boot2, faults2, err := ParseFaults(out)
		if err != nil {
			t.Fatalf("written faults do not parse: %v\n%s", err, out)
		}
		if boot2 != boot || len(faults2) != len(faults) {
			t.Fatalf("round trip changed the file: %q %v, then %q %v", boot, faults, boot2, faults2)
		}
		for id, fault := range faults {
			got := faults2[id]
			if got.Reason != fault.Reason || !got.Time.Equal(fault.Time) || !reflect.DeepEqual(got.ECCVolatileUncorrected, fault.ECCVolatileUncorrected) {
				t.Fatalf("GPU %s: %+v, then %+v", id, fault, got)
			}
		}
	})
}
