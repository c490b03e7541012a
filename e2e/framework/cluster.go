// Package framework runs an embedded Kubernetes cluster made of the real parts, for
// resclass's e2e tests, benchmarks and demo: etcd, kube-apiserver,
// kube-controller-manager and kubelets built from the pinned Kubernetes release, and
// resclass's own binaries. Everything listens on loopback on free ports and lives
// in one directory that the cluster owns and removes.
//
// The binaries are built once by `make e2e-binaries` into _output/bin (see
// BinDir); the tests only start them.
package framework

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/deploy/crds"
	deploynodeagent "github.com/resclass/resclass/deploy/node-agent"
	"github.com/resclass/resclass/deploy/roles"
	deployscheduler "github.com/resclass/resclass/deploy/scheduler"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
)

// Options configure a cluster.
type Options struct {
	// BinDir holds the binaries; empty means _output/bin of the repository.
	BinDir string
	// Progress, if set, receives one line per step, for people watching.
	Progress func(format string, args ...any)
	// Scheduler starts resclass's scheduler binary as the cluster's only scheduler.
	Scheduler bool
}

// Cluster is a running embedded cluster.
type Cluster struct {
	// Dir holds everything the cluster writes; Stop removes it.
	Dir string
	// Kubeconfig is an admin kubeconfig for kubectl and clients.
	Kubeconfig string
	// Config and Client are admin clients.
	Config *rest.Config
	Client kubernetes.Interface

	bins     binaries
	pki      *pki
	progress func(format string, args ...any)

	mu        sync.Mutex
	processes []*process // in start order
	apiserver string     // https://127.0.0.1:port
	etcd      string     // http://127.0.0.1:port
	saKey     string     // service account signing key

	kwokStarted bool

	scheduler     *process
	schedulerArgs []string
	schedulerPort int

	draSchedulerPort int // StartDRAScheduler's, once started

	resclassOnce sync.Once
	resclass     versioned.Interface
	resclassErr  error
}

// Start starts etcd, kube-apiserver and kube-controller-manager, installs the
// resclass CRDs, and, if asked, starts the scheduler. On error everything started
// is stopped again, and the error includes the logs that explain it.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	bins, err := findBinaries(opts.BinDir)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "resclass-e2e-")
	if err != nil {
		return nil, err
	}
	c = &Cluster{Dir: dir, bins: bins, progress: opts.Progress}
	if c.progress == nil {
		c.progress = func(string, ...any) {}
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, c.Diagnostics())
			_ = c.Stop()
			c = nil
		}
	}()
	if c.pki, err = newPKI(filepath.Join(dir, "pki")); err != nil {
		return c, err
	}
	if err := c.startEtcdAndAPIServer(ctx); err != nil {
		return c, err
	}
	if err := c.installCRDs(ctx); err != nil {
		return c, err
	}
	if err := c.startControllerManager(ctx); err != nil {
		return c, err
	}
	if opts.Scheduler {
		if err := c.startScheduler(ctx); err != nil {
			return c, err
		}
	}
	return c, nil
}

func (c *Cluster) startEtcdAndAPIServer(ctx context.Context) error {
	clientPort, peerPort, apiPort, err := freePort3()
	if err != nil {
		return err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	c.etcd = etcdURL
	c.progress("starting etcd")
	if _, err := c.start("etcd", c.bins.etcd, nil,
		"--data-dir="+filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL,
		"--unsafe-no-fsync", "--log-level=warn",
	); err != nil {
		return err
	}
	if err := waitHTTP(ctx, etcdURL+"/health", nil, 60*time.Second); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}

	servingCert, servingKey, err := c.pki.issue("apiserver", "kube-apiserver", nil,
		[]string{"127.0.0.1", "localhost", "10.0.0.1", "kubernetes", "kubernetes.default", "kubernetes.default.svc"})
	if err != nil {
		return err
	}
	kubeletClientCert, kubeletClientKey, err := c.pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", nil, nil)
	if err != nil {
		return err
	}
	saKey, saPub, err := c.pki.serviceAccountKey()
	c.saKey = saKey
	if err != nil {
		return err
	}
	token := "admin-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	tokenFile := filepath.Join(c.Dir, "pki", "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(token+",admin,admin-uid,system:masters\n"), 0o600); err != nil {
		return err
	}

	c.apiserver = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	c.progress("starting kube-apiserver on %s", c.apiserver)
	if _, err := c.start("kube-apiserver", c.bins.apiserver, nil,
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(apiPort),
		"--advertise-address=127.0.0.1",
		"--tls-cert-file="+servingCert, "--tls-private-key-file="+servingKey,
		"--client-ca-file="+c.pki.CAFile,
		"--token-auth-file="+tokenFile,
		// Delegated authentication in the scheduler and controller manager reads
		// these; nothing sends front-proxy requests.
		"--requestheader-client-ca-file="+c.pki.CAFile,
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--kubelet-client-certificate="+kubeletClientCert, "--kubelet-client-key="+kubeletClientKey,
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+saPub, "--service-account-signing-key-file="+saKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		// The kubernetes Service cannot point at a loopback address; nothing in the
		// cluster has a network to reach it by anyway.
		"--endpoint-reconciler-type=none",
		"--authorization-mode=Node,RBAC",
		// The default plugins, plus NodeRestriction as kubeadm enables it. All of
		// them work here: the controllers they rely on run (see
		// startControllerManager).
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		// RESCLASS_E2E_PROFILING=1 serves /debug/pprof to the admin, for a
		// benchmark that wants to know where the apiserver's time goes
		// (docs/development.md, "Benchmarks").
		"--profiling="+strconv.FormatBool(os.Getenv("RESCLASS_E2E_PROFILING") == "1"),
		"--v=1",
	); err != nil {
		return err
	}

	c.Config = &rest.Config{
		Host:            c.apiserver,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: c.pki.CAFile},
		QPS:             200,
		Burst:           400,
	}
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	if err := writeKubeconfig(c.Kubeconfig, c.apiserver, c.pki.CAFile, &clientcmdapi.AuthInfo{Token: token}); err != nil {
		return err
	}
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := c.alive("kube-apiserver"); err != nil {
			return false, err
		}
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	})
	if err != nil {
		return fmt.Errorf("kube-apiserver not ready: %w", err)
	}
	c.progress("kube-apiserver ready")
	return nil
}

// installCRDs creates the resclass CRDs and waits until they are served.
func (c *Cluster) installCRDs(ctx context.Context) error {
	all, err := crds.All()
	if err != nil {
		return err
	}
	client, err := apiextensionsclient.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	for _, crd := range all {
		if _, err := client.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating CRD %s: %w", crd.Name, err)
		}
	}
	for _, crd := range all {
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", crd.Name, err)
		}
	}
	// The ClusterRoles that fold resclass's kinds into view, edit and admin,
	// as the install ships them (the aggregation controller below fills them in).
	if _, err := c.ApplyManifestData(ctx, "deploy/roles/aggregated.yaml", roles.Aggregated); err != nil {
		return err
	}
	c.progress("installed %d resclass CRDs and the aggregated roles", len(all))
	return nil
}

// controllers are the kube-controller-manager controllers the cluster runs: what
// the tests rely on (garbage collection, namespace deletion) and what the default
// admission plugins need to work as on a real cluster (ServiceAccount needs
// service accounts and the root CA ConfigMap in every namespace;
// TaintNodesByCondition needs node-lifecycle to lift the not-ready taint).
var controllers = []string{
	"garbage-collector-controller",
	"namespace-controller",
	"serviceaccount-controller",
	"root-ca-certificate-publisher-controller",
	"node-lifecycle-controller",
	// Quota status (used, and hard as enforced): the apiserver's ResourceQuota
	// admission refuses pods in a namespace whose quota has none yet.
	"resourcequota-controller",
	// PodDisruptionBudget status, which preemption reads to spare protected
	// pods.
	"disruption-controller",
	// Folds resclass-view/-edit (deploy/roles) into view, edit and admin.
	"clusterrole-aggregation-controller",
	// DRA: releases a ResourceClaim's reservation and allocation once its pods
	// are done, and lifts the finalizer that keeps an allocated claim (the
	// scheduler's claim for extended resources included) from being deleted.
	"resourceclaim-controller",
}

func (c *Cluster) startControllerManager(ctx context.Context) error {
	kubeconfig, err := c.componentKubeconfig("kube-controller-manager", "system:kube-controller-manager", nil)
	if err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	c.progress("starting kube-controller-manager (%s)", strings.Join(controllers, ", "))
	if _, err := c.start("kube-controller-manager", c.bins.controllerManager, nil,
		"--kubeconfig="+kubeconfig,
		"--authentication-kubeconfig="+kubeconfig, "--authorization-kubeconfig="+kubeconfig,
		"--controllers="+strings.Join(controllers, ","),
		"--root-ca-file="+c.pki.CAFile,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port),
		"--leader-elect=false",
		// Each controller with its own service account and RBAC role, as kubeadm
		// runs it.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+c.saKey,
		// kwok renews thousands of simulated nodes' leases through an apiserver
		// that shares a loaded machine: at 5000 nodes some renewals came late
		// enough (the default 50 s) to taint nodes not-ready, and the pool
		// never settled. No test relies on how soon a silent node is noticed.
		"--node-monitor-grace-period=5m",
		"--v=1",
	); err != nil {
		return err
	}
	return c.waitHealthy(ctx, "kube-controller-manager", port)
}

func (c *Cluster) startScheduler(ctx context.Context) error {
	// The scheduler runs as the ServiceAccount deploy/scheduler/rbac.yaml
	// grants, so every e2e test also proves that RBAC suffices. A client
	// certificate with the ServiceAccount's user name and groups is what RBAC
	// sees for its token.
	if _, err := c.ApplyManifestData(ctx, "deploy/scheduler/rbac.yaml", append([]byte(resclassNamespace+"\n---\n"), deployscheduler.RBAC...)); err != nil {
		return err
	}
	// Only the scheduler may write the hand-off annotations, and it nothing
	// else of a pod: the admission policies as installed, so that every test
	// that schedules also proves the scheduler works within them.
	if _, err := c.ApplyManifestData(ctx, "deploy/scheduler/assignment-policy.yaml", deployscheduler.AssignmentPolicy); err != nil {
		return err
	}
	// No pod picks its own GPUs (NVIDIA_VISIBLE_DEVICES, cdi.k8s.io/
	// annotations): installed as shipped, so that every test's pods are
	// admitted under it too.
	if _, err := c.ApplyManifestData(ctx, "deploy/node-agent/gpu-isolation-policy.yaml", deploynodeagent.GPUIsolationPolicy); err != nil {
		return err
	}
	kubeconfig, err := c.componentKubeconfig("scheduler", "system:serviceaccount:resclass-system:resclass-scheduler",
		[]string{"system:serviceaccounts", "system:serviceaccounts:resclass-system", "system:authenticated"})
	if err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	config, err := SchedulerConfig(kubeconfig)
	if err != nil {
		return err
	}
	path := filepath.Join(c.Dir, "scheduler-config.yaml")
	if err := os.WriteFile(path, config, 0o644); err != nil {
		return err
	}
	c.schedulerArgs = []string{"--config=" + path,
		"--authentication-kubeconfig=" + kubeconfig, "--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
		"--v=2",
	}
	// RESCLASS_E2E_SCHEDULER_ARGS: more flags for the resclass scheduler,
	// separated by spaces, to measure a setting (docs/e2e.md), such as
	// --feature-gates=NominatedNodeNameForExpectation=false.
	c.schedulerArgs = append(c.schedulerArgs, strings.Fields(os.Getenv("RESCLASS_E2E_SCHEDULER_ARGS"))...)
	c.schedulerPort = port
	c.progress("starting the resclass scheduler")
	if c.scheduler, err = c.start("scheduler", c.bins.scheduler, nil, c.schedulerArgs...); err != nil {
		return err
	}
	return c.waitHealthy(ctx, "scheduler", port)
}

// RestartScheduler kills the scheduler (SIGKILL: no clean shutdown, as when its
// node dies) and starts it again with the same configuration. It returns once
// the new one is healthy; its caches are rebuilt from the apiserver alone.
func (c *Cluster) RestartScheduler(ctx context.Context) error {
	if c.scheduler == nil {
		return fmt.Errorf("the cluster runs no scheduler")
	}
	if done, err := c.scheduler.exited(); done {
		return fmt.Errorf("the scheduler had already exited: %w", err)
	}
	_ = c.scheduler.cmd.Process.Kill()
	<-c.scheduler.done
	c.mu.Lock()
	c.processes = slices.DeleteFunc(c.processes, func(p *process) bool { return p == c.scheduler })
	c.mu.Unlock()
	// The log of the killed one stays beside the new one's.
	_ = os.Rename(filepath.Join(c.Dir, "scheduler.log"), filepath.Join(c.Dir, fmt.Sprintf("scheduler-%d.log", time.Now().UnixNano())))
	var err error
	if c.scheduler, err = c.start("scheduler", c.bins.scheduler, nil, c.schedulerArgs...); err != nil {
		return err
	}
	return c.waitHealthy(ctx, "scheduler", c.schedulerPort)
}

// SchedulerClient is a client with the resclass scheduler's identity (its
// ServiceAccount, with the RBAC and admission policies of deploy/scheduler),
// for tests that act as the scheduler, e.g. bind a pod with an assignment
// chosen by the test.
func (c *Cluster) SchedulerClient() (kubernetes.Interface, error) {
	if c.scheduler == nil {
		return nil, fmt.Errorf("the cluster runs no scheduler")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(c.Dir, "scheduler.kubeconfig"))
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// BindAsScheduler binds pod to node with annotations in the Binding, as the
// resclass scheduler does (assignmentWrite: Binding), under its identity: the
// way a test hands a pod an assignment of its own choosing now that no other
// identity may write one.
func (c *Cluster) BindAsScheduler(ctx context.Context, pod *corev1.Pod, node string, annotations map[string]string) error {
	client, err := c.SchedulerClient()
	if err != nil {
		return err
	}
	return client.CoreV1().Pods(pod.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Annotations: annotations},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{})
}

// PreBindSchedulerName is the embedded cluster's third profile: the shipped one
// with assignmentWrite: PreBind.
const PreBindSchedulerName = "resclass-scheduler-prebind"

// TopologySchedulerName is the embedded cluster's fourth profile: the shipped
// one with strategy: Topology.
const TopologySchedulerName = "resclass-scheduler-topology"

const resclassNamespace = `apiVersion: v1
kind: Namespace
metadata:
  name: resclass-system`

// SchedulerConfig is deploy/scheduler/config.yaml as the embedded cluster runs
// it: with kubeconfig, without leader election (one replica), client QPS as
// scheduler_perf sets it (the default 50 caps binding at ~55 pods/s), and the
// resclass-scheduler profile also named default-scheduler, because here it is
// the cluster's only scheduler, once more as PreBindSchedulerName, and once
// more as TopologySchedulerName.
func SchedulerConfig(kubeconfig string) ([]byte, error) {
	var cfg map[string]any
	if err := yaml.Unmarshal(deployscheduler.Config, &cfg); err != nil {
		return nil, fmt.Errorf("deploy/scheduler/config.yaml: %w", err)
	}
	cfg["leaderElection"] = map[string]any{"leaderElect": false}
	cfg["clientConnection"] = map[string]any{"kubeconfig": kubeconfig, "qps": 5000, "burst": 5000}
	profiles, _ := cfg["profiles"].([]any)
	if len(profiles) != 1 {
		return nil, fmt.Errorf("deploy/scheduler/config.yaml: want one profile, found %d", len(profiles))
	}
	profile, err := yaml.Marshal(profiles[0])
	if err != nil {
		return nil, err
	}
	clone := func(name string) (map[string]any, error) {
		var p map[string]any
		if err := yaml.Unmarshal(profile, &p); err != nil {
			return nil, err
		}
		p["schedulerName"] = name
		return p, nil
	}
	def, err := clone(corev1.DefaultSchedulerName)
	if err != nil {
		return nil, err
	}
	// The same profile writing assignments in PreBind instead of the Binding,
	// for tests and benchmarks of that mode.
	prebind, err := clone(PreBindSchedulerName)
	if err != nil {
		return nil, err
	}
	for _, pc := range prebind["pluginConfig"].([]any) {
		if pc := pc.(map[string]any); pc["name"] == "ResourceClasses" {
			pc["args"].(map[string]any)["assignmentWrite"] = "PreBind"
		}
	}
	// The same profile with the Topology strategy, for its tests and
	// benchmarks.
	topology, err := clone(TopologySchedulerName)
	if err != nil {
		return nil, err
	}
	for _, pc := range topology["pluginConfig"].([]any) {
		if pc := pc.(map[string]any); pc["name"] == "ResourceClasses" {
			pc["args"].(map[string]any)["strategy"] = "Topology"
		}
	}
	cfg["profiles"] = append(profiles, def, prebind, topology)
	return yaml.Marshal(cfg)
}

// serviceAccountKubeconfig writes a kubeconfig with a token of the
// ServiceAccount namespace/name (TokenRequest, valid for a day): what a pod
// of that ServiceAccount presents. The apiserver caches a verified token for
// 10 s, where it verifies a client certificate on every request, so a
// component whose request rate a benchmark measures runs as a pod would.
func (c *Cluster) serviceAccountKubeconfig(ctx context.Context, file, namespace, name string) (string, error) {
	tr, err := c.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("a token for ServiceAccount %s/%s: %w", namespace, name, err)
	}
	path := filepath.Join(c.Dir, file+".kubeconfig")
	return path, writeKubeconfig(path, c.apiserver, c.pki.CAFile, &clientcmdapi.AuthInfo{Token: tr.Status.Token})
}

// componentKubeconfig writes a kubeconfig with a client certificate for user in
// groups.
func (c *Cluster) componentKubeconfig(name, user string, groups []string) (string, error) {
	cert, key, err := c.pki.issue(name, user, groups, nil)
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.Dir, name+".kubeconfig")
	return path, writeKubeconfig(path, c.apiserver, c.pki.CAFile, &clientcmdapi.AuthInfo{ClientCertificate: cert, ClientKey: key})
}

func (c *Cluster) start(name, bin string, attr *syscall.SysProcAttr, args ...string) (*process, error) {
	p, err := startProcess(name, filepath.Join(c.Dir, name+".log"), bin, args, attr)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.processes = append(c.processes, p)
	c.mu.Unlock()
	return p, nil
}

// alive returns an error if the named component has exited.
func (c *Cluster) alive(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.processes {
		if p.name == name {
			if done, err := p.exited(); done {
				return fmt.Errorf("%s exited: %w", name, err)
			}
		}
	}
	return nil
}

func (c *Cluster) waitHealthy(ctx context.Context, name string, port int) error {
	url := fmt.Sprintf("https://127.0.0.1:%d/healthz", port)
	// Components serve /healthz with a self-signed certificate of their own.
	insecure := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // loopback health check of a self-signed component
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := c.alive(name); err != nil {
			return false, err
		}
		return waitHTTP(ctx, url, insecure, 0) == nil, nil
	})
	if err != nil {
		return fmt.Errorf("%s not healthy: %w", name, err)
	}
	c.progress("%s healthy", name)
	return nil
}

// Stop stops every component, newest first, and removes the cluster's directory.
// It reports components that had died or would not stop.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	procs := append([]*process(nil), c.processes...)
	c.processes = nil
	c.mu.Unlock()
	var errs []error
	for i := len(procs) - 1; i >= 0; i-- {
		if err := procs[i].stop(20 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Processes returns the process ids of every running component, nodes included.
func (c *Cluster) Processes() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var pids []int
	for _, p := range c.processes {
		pids = append(pids, p.cmd.Process.Pid)
	}
	return pids
}

// PID returns the process id of the named component (e.g. "kube-apiserver").
func (c *Cluster) PID(name string) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.processes {
		if p.name == name {
			return p.cmd.Process.Pid, nil
		}
	}
	return 0, fmt.Errorf("the cluster runs no %s", name)
}

// Diagnostics is the tail of every component's log: print it when a test fails.
func (c *Cluster) Diagnostics() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for _, p := range c.processes {
		state := "running"
		if done, err := p.exited(); done {
			state = fmt.Sprintf("exited: %v", err)
		}
		fmt.Fprintf(&b, "--- %s (%s), last lines of %s:\n%s", p.name, state, p.logPath, p.tail(15))
	}
	return b.String()
}

func writeKubeconfig(path, server, caFile string, user *clientcmdapi.AuthInfo) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["resclass-e2e"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	kc.AuthInfos["user"] = user
	kc.Contexts["resclass-e2e"] = &clientcmdapi.Context{Cluster: "resclass-e2e", AuthInfo: "user"}
	kc.CurrentContext = "resclass-e2e"
	return clientcmd.WriteToFile(*kc, path)
}

// waitHTTP GETs url until it answers 200 (once, when timeout is 0).
func waitHTTP(ctx context.Context, url string, client *http.Client, timeout time.Duration) error {
	if client == nil {
		client = &http.Client{Timeout: 2 * time.Second}
	}
	try := func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	}
	if timeout == 0 {
		return try()
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		last = try()
		return last == nil, nil
	})
	if err != nil && last != nil {
		return fmt.Errorf("%w (last: %w)", err, last)
	}
	return err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// freePort3 returns three distinct free ports, held open together so they differ.
func freePort3() (int, int, int, error) {
	var ports [3]int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, 0, 0, err
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports[0], ports[1], ports[2], nil
}

// ServingCert issues a certificate for a server on 127.0.0.1 (a webhook, say),
// signed by the cluster's CA, and returns the CA bundle to register it with (e.g.
// a webhook configuration's clientConfig.caBundle).
func (c *Cluster) ServingCert(name string) (certFile, keyFile string, caBundle []byte, err error) {
	certFile, keyFile, err = c.pki.issue("serving-"+name, name, nil, []string{"127.0.0.1", "localhost"})
	if err != nil {
		return "", "", nil, err
	}
	caBundle, err = os.ReadFile(c.pki.CAFile)
	return certFile, keyFile, caBundle, err
}
