package framework

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	deploydistribution "github.com/resclass/resclass/deploy/distribution"
)

// DistributionUser is the user the ResourceDistribution controller runs as:
// deploy/distribution's ServiceAccount, which its RBAC and admission policy
// name.
const DistributionUser = "system:serviceaccount:resclass-system:resclass-distribution"

// DistributionOptions configure the ResourceDistribution controller.
type DistributionOptions struct {
	// Args are more flags for the binary.
	Args []string
}

// Distribution is the ResourceDistribution controller (the webhook binary
// with --mode=distribution-controller) running against the cluster as its
// own ServiceAccount, with a token of it, within deploy/distribution's RBAC
// and admission policy.
type Distribution struct {
	// MetricsURL is its /metrics (plain HTTP).
	MetricsURL string

	proc *process
	c    *Cluster
}

// StartDistribution applies deploy/distribution (RBAC, the admission policy
// that fences the controller's writes) and starts the controller as its
// ServiceAccount. It returns once the controller is ready.
func (c *Cluster) StartDistribution(ctx context.Context, opts DistributionOptions) (*Distribution, error) {
	if _, err := c.ApplyManifestData(ctx, "deploy/distribution/rbac.yaml", append([]byte(resclassNamespace+"\n---\n"), deploydistribution.RBAC...)); err != nil {
		return nil, err
	}
	if _, err := c.ApplyManifestData(ctx, "deploy/distribution/policy.yaml", deploydistribution.Policy); err != nil {
		return nil, err
	}
	// A token of its ServiceAccount, as its pods have: the apiserver's cost
	// per request is then a production one (BenchmarkDistributionConvergence
	// measures it).
	kubeconfig, err := c.serviceAccountKubeconfig(ctx, "distribution", "resclass-system", "resclass-distribution")
	if err != nil {
		return nil, err
	}
	_, healthPort, metricsPort, err := freePort3()
	if err != nil {
		return nil, err
	}
	d := &Distribution{MetricsURL: fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort), c: c}
	args := append([]string{"--mode=distribution-controller",
		"--kubeconfig=" + kubeconfig, "--namespace=resclass-system",
		"--health-probe-bind-address=127.0.0.1:" + strconv.Itoa(healthPort),
		"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(metricsPort), "--metrics-secure=false",
		"--v=2",
	}, opts.Args...)
	c.progress("starting the ResourceDistribution controller")
	if d.proc, err = c.start("distribution", c.bins.webhook, nil, args...); err != nil {
		return nil, err
	}
	if err := c.waitReady(ctx, "distribution", healthPort); err != nil {
		_ = d.Stop()
		return nil, err
	}
	return d, nil
}

// Stop stops the controller.
func (d *Distribution) Stop() error {
	err := d.proc.stop(10 * time.Second)
	d.c.mu.Lock()
	d.c.processes = slices.DeleteFunc(d.c.processes, func(p *process) bool { return p == d.proc })
	d.c.mu.Unlock()
	return err
}

// PID is the controller process's id.
func (d *Distribution) PID() int { return d.proc.cmd.Process.Pid }

// Log is the controller's log so far.
func (d *Distribution) Log() string {
	data, _ := os.ReadFile(d.proc.logPath)
	return string(data)
}
