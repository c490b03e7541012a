package framework

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// process is one component of the cluster, running as a child process with its
// output in a log file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// startProcess runs bin with args, output to logPath. The child is killed if the
// harness dies (Pdeathsig), so a crashed test leaves nothing running. It runs
// in a process group of its own: Ctrl-C in a terminal signals the foreground
// group, and the harness, not the terminal, stops its processes, in order.
func startProcess(name, logPath, bin string, args []string, attr *syscall.SysProcAttr) (*process, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	if attr == nil {
		attr = &syscall.SysProcAttr{}
	}
	attr.Pdeathsig = syscall.SIGKILL
	attr.Setpgid = true
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM and waits, then SIGKILL. An exit caused by the SIGTERM is a
// clean stop.
func (p *process) stop(grace time.Duration) error {
	if done, err := p.exited(); done {
		if err == nil {
			return fmt.Errorf("%s had already exited (status 0)", p.name)
		}
		return fmt.Errorf("%s had already exited: %w", p.name, err)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop within %v of SIGTERM and was killed", p.name, grace)
	}
}

// tail returns the last n lines of the process's log.
func (p *process) tail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("    ")
		b.Write(l)
		b.WriteByte('\n')
	}
	return b.String()
}
