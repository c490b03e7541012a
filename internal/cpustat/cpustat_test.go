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
	x := 0
	for start := time.Now(); time.Since(start) < 300*time.Millisecond; {
		x++
	}
	after, err := Process(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Errorf("CPU time %v after a busy loop (%d turns), %v before", after, x, before)
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
