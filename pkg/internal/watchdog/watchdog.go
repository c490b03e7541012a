// Package watchdog catches inputs that make a parser or a matcher run away: a
// hang detector for fuzz targets and regression tests, not a timing
// assertion. Its limit is thousands of times what any input should cost, so
// only an unbounded computation (a quantity of 1e999999999 compared with
// big decimals) trips it.
package watchdog

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
)

// Limit is how long one input may run while fuzzing. Outside fuzzing (the seed
// corpus and regression tests in `make test`, on a machine that may be busy
// with other packages) the limit is ten times longer: either way far above
// microseconds and far below forever.
const Limit = time.Second

// Run calls f, and if f has not returned after the limit, prints every
// goroutine's stack and crashes the process: a goroutine that does not return
// cannot be stopped, and a crash is what the fuzzer records, with the input,
// in testdata/fuzz.
func Run(tb testing.TB, f func()) {
	tb.Helper()
	limit := Limit
	if !fuzzing() {
		limit *= 10
	}
	done := make(chan struct{})
	timer := time.AfterFunc(limit, func() {
		select {
		case <-done:
			return
		default:
		}
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		fmt.Fprintf(os.Stderr, "watchdog: %s: one input still running after %v\n%s\n", tb.Name(), limit, buf[:n])
		panic(fmt.Sprintf("watchdog: %s: one input still running after %v", tb.Name(), limit))
	})
	defer func() {
		close(done)
		timer.Stop()
	}()
	f()
}

func fuzzing() bool {
	f := flag.Lookup("test.fuzz")
	return f != nil && f.Value.String() != ""
}
