package framework

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"sigs.k8s.io/yaml"

	deployscheduler "github.com/resclass/resclass/deploy/scheduler"
)

// DRASchedulerName is the profile of deploy/scheduler/dra/config.yaml: the
// stock kube-scheduler profile, with DRAExtendedResource on, confined to
// DRA-mode nodes (docs/dra.md).
const DRASchedulerName = "resclass-dra"

// StartDRAScheduler starts a second scheduler beside the resclass one: the
// scheduler binary with --feature-gates=DRAExtendedResource=true (the
// default of upstream kube-scheduler 1.36, which the binary turns off) and
// deploy/scheduler/dra/config.yaml, whose one profile is upstream's default
// plugins, unmodified, plus NodeAffinity's addedAffinity to DRA-mode nodes. It
// runs as the ServiceAccount resclass-dra-scheduler with the RBAC
// deploy/scheduler/dra/rbac.yaml grants (upstream's scheduler roles, nothing
// of resclass.io), within the admission policies the resclass scheduler's
// start applied, so every test that schedules through it also proves that
// RBAC suffices. A second call does nothing.
func (c *Cluster) StartDRAScheduler(ctx context.Context) error {
	c.mu.Lock()
	started := c.draSchedulerPort != 0
	c.mu.Unlock()
	if started {
		return nil
	}
	if _, err := c.ApplyManifestData(ctx, "deploy/scheduler/dra/rbac.yaml", append([]byte(resclassNamespace+"\n---\n"), deployscheduler.DRARBAC...)); err != nil {
		return err
	}
	// A client certificate with the ServiceAccount's user name and groups is
	// what RBAC sees for its token.
	kubeconfig, err := c.componentKubeconfig("scheduler-dra", "system:serviceaccount:resclass-system:resclass-dra-scheduler",
		[]string{"system:serviceaccounts", "system:serviceaccounts:resclass-system", "system:authenticated"})
	if err != nil {
		return err
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(deployscheduler.DRAConfig, &cfg); err != nil {
		return fmt.Errorf("deploy/scheduler/dra/config.yaml: %w", err)
	}
	// One replica; the client as scheduler_perf sets it, as for the resclass
	// scheduler (SchedulerConfig).
	cfg["leaderElection"] = map[string]any{"leaderElect": false}
	cfg["clientConnection"] = map[string]any{"kubeconfig": kubeconfig, "qps": 5000, "burst": 5000}
	config, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	path := filepath.Join(c.Dir, "scheduler-dra-config.yaml")
	if err := os.WriteFile(path, config, 0o644); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	c.progress("starting the stock scheduler profile %s", DRASchedulerName)
	if _, err := c.start("scheduler-dra", c.bins.scheduler, nil, "--config="+path,
		"--feature-gates=DRAExtendedResource=true",
		"--authentication-kubeconfig="+kubeconfig, "--authorization-kubeconfig="+kubeconfig,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port),
		"--v=2",
	); err != nil {
		return err
	}
	if err := c.waitHealthy(ctx, "scheduler-dra", port); err != nil {
		return err
	}
	c.mu.Lock()
	c.draSchedulerPort = port
	c.mu.Unlock()
	return nil
}

// DRASchedulerStarted says whether StartDRAScheduler has started it.
func (c *Cluster) DRASchedulerStarted() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.draSchedulerPort != 0
}
