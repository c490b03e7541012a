// Package cpustat reads CPU times from /proc, for benchmarks that must tell
// their own work apart from the rest of the machine's: a figure taken while
// other processes competed for the cores is not worth reporting.
package cpustat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of /proc's CPU times: USER_HZ, 100 on every Linux
// architecture Go supports.
const clockTick = 10 * time.Millisecond

// Process is the CPU time (utime + stime, all threads) process pid has used,
// from /proc/<pid>/stat; os.Getpid() gives the caller's own.
func Process(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis are plain: state is field 3, utime 14, stime 15.
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// Machine is the CPU time every process on the machine has used (all
// cores; /proc/stat's user, nice, system, irq, softirq and steal), so that a
// benchmark can tell how much of it was not its own.
func Machine() (time.Duration, error) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} { // user nice system (idle iowait) irq softirq steal
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %q", line)
		}
		ticks += v
	}
	return time.Duration(ticks) * clockTick, nil
}
