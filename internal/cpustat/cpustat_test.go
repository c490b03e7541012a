package cpustat

import (
	"os"
	"testing"
	"time"
)

// TestCountsOwnWork: a busy loop shows in the process's CPU time, and the
// machine's is at least the process's.
func TestCountsOwnWork(t *testing.T) {
	before, err := Process(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Spin until the process's CPU time moves (a tick is 10 ms); on a
	// machine busy enough to starve it for half a minute, fail.
	after := before
	for deadline := time.Now().Add(30 * time.Second); after <= before; {
		if time.Now().After(deadline) {
			t.Fatalf("the CPU time stayed %v through a 30 s busy loop", before)
		}
		if after, err = Process(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
	machine, err := Machine()
	if err != nil {
		t.Fatal(err)
	}
	if machine < after {
		t.Errorf("the machine's CPU time %v is less than this process's %v", machine, after)
	}
	if _, err := Process(-1); err == nil {
		t.Error("Process(-1) gave no error")
	}
}
