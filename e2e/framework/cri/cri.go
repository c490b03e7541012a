// Package cri is the container runtime of the e2e harness's kubelet nodes: the CRI
// fake from k8s.io/cri-client (which keeps pods and containers in memory and runs
// nothing) with every CreateContainer request recorded, so tests can read what the
// kubelet asked the runtime for: the env, device nodes, mounts and CDI devices that
// device plugins contributed.
package cri

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

// Record is one CreateContainer request as the kubelet sent it.
type Record struct {
	Time        time.Time                           `json:"time"`
	Namespace   string                              `json:"namespace"`
	Pod         string                              `json:"pod"`
	Container   string                              `json:"container"`
	Image       string                              `json:"image"`
	Env         map[string]string                   `json:"env"`
	Devices     []*runtimeapi.Device                `json:"devices,omitempty"`
	Mounts      []*runtimeapi.Mount                 `json:"mounts,omitempty"`
	CDIDevices  []*runtimeapi.CDIDevice             `json:"cdiDevices,omitempty"`
	Annotations map[string]string                   `json:"annotations,omitempty"`
	Resources   *runtimeapi.LinuxContainerResources `json:"resources,omitempty"`
}

// Runtime serves the CRI runtime and image services on a unix socket.
type Runtime struct {
	srv *grpc.Server

	mu       sync.Mutex
	log      *os.File
	logPaths map[string]string // container id -> CRI log file
	exits    map[string]int32  // container id -> exit code, for EnvExitCode
	fake     *fake.RemoteRuntime
}

// EnvExitCode, set on a container, makes it exit with this code as soon as it
// starts: the runtime runs nothing, so without it every container runs forever
// and a pod's init containers never complete.
const EnvExitCode = "RESCLASS_E2E_EXIT_CODE"

// runtimeService is the fake's runtime service with CreateContainer recorded and
// what the fake gets wrong for a real kubelet fixed.
type runtimeService struct {
	*fake.RemoteRuntime
	r *Runtime
}

// Start serves the runtime on socket and appends a JSON line per CreateContainer
// request to recordPath.
func Start(socket, recordPath string) (*Runtime, error) {
	f := fake.NewFakeRemoteRuntime()
	f.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true}, {Type: runtimeapi.NetworkReady, Status: true},
	}}
	// An image of size 0 fails the kubelet's image inspection.
	f.ImageService.SetFakeImageSize(10 << 20)
	f.RuntimeService.FakeLinuxConfiguration = &runtimeapi.LinuxRuntimeConfiguration{CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS}

	log, err := os.OpenFile(recordPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	if err := os.Remove(socket); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	l, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	r := &Runtime{srv: grpc.NewServer(), log: log, logPaths: map[string]string{}, exits: map[string]int32{}, fake: f}
	runtimeapi.RegisterRuntimeServiceServer(r.srv, runtimeService{RemoteRuntime: f, r: r})
	runtimeapi.RegisterImageServiceServer(r.srv, f)
	go func() { _ = r.srv.Serve(l) }()
	return r, nil
}

// Stop stops serving.
func (r *Runtime) Stop() {
	r.srv.Stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.log.Close()
}

// CreateContainer records the request before handing it to the fake. The fake runs
// nothing, so it also writes one CRI-format log line for `kubectl logs`.
func (s runtimeService) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	c := req.GetConfig()
	rec := Record{
		Time:        time.Now(),
		Namespace:   req.GetSandboxConfig().GetMetadata().GetNamespace(),
		Pod:         req.GetSandboxConfig().GetMetadata().GetName(),
		Container:   c.GetMetadata().GetName(),
		Image:       c.GetImage().GetImage(),
		Env:         map[string]string{},
		Devices:     c.GetDevices(),
		Mounts:      c.GetMounts(),
		CDIDevices:  c.GetCDIDevices(),
		Annotations: c.GetAnnotations(),
		Resources:   c.GetLinux().GetResources(),
	}
	for _, kv := range c.GetEnvs() {
		rec.Env[kv.GetKey()] = string(kv.GetValue())
	}
	line, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	s.r.mu.Lock()
	_, err = fmt.Fprintln(s.r.log, string(line))
	s.r.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("recording CreateContainer: %w", err)
	}

	resp, err := s.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	if v, ok := rec.Env[EnvExitCode]; ok {
		code, err := strconv.ParseInt(v, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %w", EnvExitCode, v, err)
		}
		s.r.mu.Lock()
		s.r.exits[resp.GetContainerId()] = int32(code)
		s.r.mu.Unlock()
	}
	if dir, name := req.GetSandboxConfig().GetLogDirectory(), c.GetLogPath(); dir != "" && name != "" {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		line := time.Now().Format(time.RFC3339Nano) + " stdout F container " + rec.Container + " started by the resclass e2e runtime\n"
		if err := os.WriteFile(p, []byte(line), 0o644); err != nil {
			return nil, err
		}
		s.r.mu.Lock()
		s.r.logPaths[resp.GetContainerId()] = p
		s.r.mu.Unlock()
	}
	return resp, nil
}

// StartContainer starts the container in the fake, and ends it at once if it
// was created with EnvExitCode.
func (s runtimeService) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	resp, err := s.RemoteRuntime.StartContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	s.r.mu.Lock()
	code, exits := s.r.exits[req.GetContainerId()]
	s.r.mu.Unlock()
	if exits {
		rs := s.r.fake.RuntimeService
		rs.Lock()
		if c, ok := rs.Containers[req.GetContainerId()]; ok {
			c.State = runtimeapi.ContainerState_CONTAINER_EXITED
			c.FinishedAt = time.Now().UnixNano()
			c.ExitCode = code
			c.Reason = "Completed"
		}
		rs.Unlock()
	}
	return resp, nil
}

// ContainerStatus reports the log path written by CreateContainer. The fake reports
// an empty one, and the kubelet's log cleanup then globs "<LogPath>*" = "*" in its
// working directory and deletes every file there.
func (s runtimeService) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	resp, err := s.RemoteRuntime.ContainerStatus(ctx, req)
	if err != nil || resp.GetStatus() == nil {
		return resp, err
	}
	s.r.mu.Lock()
	p, ok := s.r.logPaths[req.GetContainerId()]
	s.r.mu.Unlock()
	if !ok {
		// Never hand the kubelet an empty path; one that matches nothing is safe.
		p = filepath.Join(os.TempDir(), "resclass-e2e-no-log", req.GetContainerId())
	}
	resp.Status.LogPath = p
	return resp, nil
}

// ImageFsInfo reports a plausible image filesystem; the fake reports none, and the
// kubelet's image garbage collection and eviction manager need one.
func (s runtimeService) ImageFsInfo(context.Context, *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	now := time.Now().UnixNano()
	fs := &runtimeapi.FilesystemUsage{
		Timestamp:  now,
		FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: "/"},
		UsedBytes:  &runtimeapi.UInt64Value{Value: 1 << 30},
		InodesUsed: &runtimeapi.UInt64Value{Value: 1000},
	}
	return &runtimeapi.ImageFsInfoResponse{ImageFilesystems: []*runtimeapi.FilesystemUsage{fs}, ContainerFilesystems: []*runtimeapi.FilesystemUsage{fs}}, nil
}

// ReadRecords reads the CreateContainer requests recorded at path.
func ReadRecords(path string) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var out []Record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}
