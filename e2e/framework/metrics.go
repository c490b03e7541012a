package framework

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/resclass/resclass/internal/cpustat"
)

// CPUTimes returns the CPU time (user + system, all threads) each running
// component has used so far, by component name ("etcd", "kube-apiserver",
// "kube-controller-manager", "scheduler", "kwok", "node-<name>", ...), read
// from /proc/<pid>/stat. A benchmark takes it before and after a run to say
// which process paid for it.
func (c *Cluster) CPUTimes() (map[string]time.Duration, error) {
	c.mu.Lock()
	procs := map[string]int{}
	for _, p := range c.processes {
		if done, _ := p.exited(); !done {
			procs[p.name] = p.cmd.Process.Pid
		}
	}
	c.mu.Unlock()
	out := make(map[string]time.Duration, len(procs))
	for name, pid := range procs {
		d, err := ProcessCPU(pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = d
	}
	return out, nil
}

// ProcessCPU is the CPU time (utime + stime) process pid has used, from
// /proc/<pid>/stat; os.Getpid() gives the caller's own.
func ProcessCPU(pid int) (time.Duration, error) { return cpustat.Process(pid) }

// MachineCPU is the CPU time every process on the machine has used, so that
// a benchmark can tell how much of it was not the cluster's nor its own.
func MachineCPU() (time.Duration, error) { return cpustat.Machine() }

// DirectReclaim is how often the kernel made processes reclaim memory
// themselves since boot (/proc/vmstat: allocstall_* stalls, pgscan_direct
// pages scanned): time it charges to whichever process allocates, the
// cluster's and the benchmark's included.
func DirectReclaim() (stalls, scanned int64, err error) {
	raw, err := os.ReadFile("/proc/vmstat")
	if err != nil {
		return 0, 0, err
	}
	stalls, scanned = parseVMStat(string(raw))
	return stalls, scanned, nil
}

func parseVMStat(raw string) (stalls, scanned int64) {
	for line := range strings.Lines(raw) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(name, "allocstall_"):
			stalls += v
		case name == "pgscan_direct":
			scanned += v
		}
	}
	return stalls, scanned
}

// Metrics returns the samples of a component's /metrics: "kube-apiserver",
// "etcd" or "scheduler" (read as the admin).
func (c *Cluster) Metrics(ctx context.Context, component string) (Samples, error) {
	raw, err := c.get(ctx, component, "/metrics")
	if err != nil {
		return nil, err
	}
	return parseSamples(bytes.NewReader(raw))
}

// CPUProfile returns a pprof CPU profile of the "scheduler" or the
// "kube-apiserver" (which serves one only when the cluster was started with
// RESCLASS_E2E_PROFILING=1) over the next d.
func (c *Cluster) CPUProfile(ctx context.Context, component string, d time.Duration) ([]byte, error) {
	return c.get(ctx, component, fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(d.Seconds())))
}

// AllocsProfile returns a pprof profile of what the "scheduler" allocated
// over the next d.
func (c *Cluster) AllocsProfile(ctx context.Context, component string, d time.Duration) ([]byte, error) {
	return c.get(ctx, component, fmt.Sprintf("/debug/pprof/allocs?seconds=%d", int(d.Seconds())))
}

// HeapProfile returns a pprof profile of what the "scheduler" holds, as of
// its last garbage collection (it does not force one).
func (c *Cluster) HeapProfile(ctx context.Context, component string) ([]byte, error) {
	return c.get(ctx, component, "/debug/pprof/heap")
}

func (c *Cluster) get(ctx context.Context, component, path string) ([]byte, error) {
	var (
		url    string
		client = &http.Client{Timeout: 2 * time.Minute}
	)
	switch component {
	case "kube-apiserver":
		p, query, _ := strings.Cut(path, "?")
		req := c.Client.CoreV1().RESTClient().Get().AbsPath(p)
		if query != "" {
			k, v, _ := strings.Cut(query, "=")
			req = req.Param(k, v)
		}
		return req.DoRaw(ctx)
	case "etcd":
		url = c.etcd + path
	case "scheduler", "scheduler-dra":
		port := c.schedulerPort
		if component == "scheduler-dra" {
			c.mu.Lock()
			port = c.draSchedulerPort
			c.mu.Unlock()
		}
		if port == 0 {
			return nil, fmt.Errorf("the cluster runs no %s", component)
		}
		url = fmt.Sprintf("https://127.0.0.1:%d%s", port, path)
		// The scheduler serves a self-signed certificate of its own.
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // loopback metrics of a self-signed component
	default:
		return nil, fmt.Errorf("no %s for component %q", path, component)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if component == "scheduler" || component == "scheduler-dra" {
		req.Header.Set("Authorization", "Bearer "+c.Config.BearerToken)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return nil, fmt.Errorf("%s: %s: %s", url, resp.Status, body)
	}
	return io.ReadAll(resp.Body)
}

// Samples are the samples of a Prometheus text exposition.
type Samples []Sample

// Sample is one line of it: name, labels, value.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Sum adds the values of the samples named name whose labels include every
// key=value pair of match (a value "*" matches any).
func (s Samples) Sum(name string, match ...string) float64 {
	var sum float64
	for _, x := range s {
		if x.Name == name && x.matches(match) {
			sum += x.Value
		}
	}
	return sum
}

// By adds the values of the samples named name whose labels include match,
// grouped by the value of label key.
func (s Samples) By(name, key string, match ...string) map[string]float64 {
	out := map[string]float64{}
	for _, x := range s {
		if x.Name == name && x.matches(match) {
			out[x.Labels[key]] += x.Value
		}
	}
	return out
}

func (x Sample) matches(match []string) bool {
	for _, m := range match {
		k, v, _ := strings.Cut(m, "=")
		got, ok := x.Labels[k]
		if !ok || (v != "*" && got != v) {
			return false
		}
	}
	return true
}

// parseSamples reads the Prometheus text format, enough of it for the
// harness's own metrics reads: comments skipped, label values unquoted.
func parseSamples(r io.Reader) (Samples, error) {
	var out Samples
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		var x Sample
		var rest string
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				return nil, fmt.Errorf("metrics: %q", line)
			}
			x.Name = line[:i]
			labels, err := parseLabels(line[i+1 : j])
			if err != nil {
				return nil, fmt.Errorf("metrics: %q: %w", line, err)
			}
			x.Labels = labels
			rest = strings.TrimSpace(line[j+1:])
		} else {
			name, value, ok := strings.Cut(line, " ")
			if !ok {
				return nil, fmt.Errorf("metrics: %q", line)
			}
			x.Name, rest = name, value
		}
		value, _, _ := strings.Cut(rest, " ") // a timestamp may follow
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: %q: %w", line, err)
		}
		x.Value = v
		out = append(out, x)
	}
	return out, sc.Err()
}

func parseLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	for s != "" {
		k, rest, ok := strings.Cut(s, "=")
		if !ok || rest == "" || rest[0] != '"' {
			return nil, fmt.Errorf("label %q", s)
		}
		// The value is a Go-style quoted string: find its closing quote.
		end := 1
		for ; end < len(rest); end++ {
			if rest[end] == '\\' {
				end++
				continue
			}
			if rest[end] == '"' {
				break
			}
		}
		if end >= len(rest) {
			return nil, fmt.Errorf("label %q: unterminated value", s)
		}
		v, err := strconv.Unquote(rest[:end+1])
		if err != nil {
			v = rest[1:end]
		}
		labels[strings.TrimSpace(k)] = v
		s = strings.TrimPrefix(strings.TrimSpace(rest[end+1:]), ",")
	}
	return labels, nil
}
