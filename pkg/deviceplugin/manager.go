package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// KubeletSocket is the kubelet's registration socket, in the plugin directory.
const KubeletSocket = "kubelet.sock"

// Timeouts of the calls the manager makes itself.
const (
	confirmTimeout  = 2 * time.Second
	registerTimeout = 5 * time.Second
	// recheckInterval is a backstop for missed file-system events.
	recheckInterval = 5 * time.Second
	maxBackoff      = 30 * time.Second
)

// DefaultDrainTimeout is how long a stopping endpoint gives the calls in
// flight to finish, unless SetDrainTimeout says otherwise.
const DefaultDrainTimeout = 5 * time.Second

// Observer is told about the lifecycle, for metrics. Any method may be nil.
type Observer struct {
	Registered func(resource string, err error)
	Restarted  func(resource string)
}

// Manager runs one endpoint per resource in the kubelet's plugin directory and
// keeps each one served and registered.
//
// The desired endpoints and devices come from Set; Run does everything that
// touches sockets, in one goroutine: it (re)starts an endpoint whose server
// stopped or whose socket file is gone or replaced, confirms a started server by
// dialling it, and registers every endpoint with each kubelet it has not yet
// registered with. A kubelet restart deletes every socket in the directory and
// creates a new kubelet.sock; a file-system watch on the directory notices both,
// so endpoints are back within moments.
type Manager struct {
	dir      string
	handler  Handler
	observer Observer

	// drainTimeout bounds how long a stopping endpoint waits for its calls
	// in flight; draining counts the endpoints still draining.
	drainTimeout time.Duration
	draining     sync.WaitGroup

	mu      sync.Mutex
	desired map[string]*endpoint // by resource
	kick    chan struct{}

	// Owned by Run's goroutine: the running endpoints, the kubelet.sock last
	// seen and the directory watched (dir.go).
	running map[string]*server
	kubelet fileID
	watched *watchedDir
	// orphaned is set while the directory is orphaned (dir.go).
	orphaned atomic.Bool
}

// server is a running endpoint.
type server struct {
	ep   *endpoint
	grpc *grpc.Server
	done chan struct{} // closed when Serve returns
	ino  fileID        // the socket it listens on
	// kubelet is the kubelet.sock it registered with, zero if none.
	kubelet  fileID
	failures int
	retryAt  time.Time
}

// NewManager returns a manager of endpoints in dir (the kubelet's device-plugin
// directory) whose allocation calls go to handler.
func NewManager(dir string, handler Handler, observer Observer) *Manager {
	return &Manager{
		dir: dir, handler: handler, observer: observer,
		desired: map[string]*endpoint{}, kick: make(chan struct{}, 1),
		running: map[string]*server{}, drainTimeout: DefaultDrainTimeout,
	}
}

// SetDrainTimeout sets how long an endpoint that stops (its resource is no
// longer Set, or Run's context ended) lets the kubelet's calls in flight
// finish before it cancels them. An Allocate may be waiting for its pod to
// reach the handler's cache: cancelled, it fails that pod's admission, so the
// bound should cover the handler's longest wait. Call it before Run.
func (m *Manager) SetDrainTimeout(d time.Duration) {
	if d > 0 {
		m.drainTimeout = d
	}
}

// SocketName is the socket file of resource's endpoint: rc-<last part of the
// resource name>.sock. The short prefix keeps the longest class name (63
// characters) within the 107 bytes a unix socket path may have under
// /var/lib/kubelet/device-plugins/.
func SocketName(resource string) string {
	return "rc-" + filepath.Base(resource) + ".sock"
}

// Set makes resources (name -> devices) the endpoints to run. Endpoints already
// running only get their devices updated, which their ListAndWatch streams
// send at once; endpoints not named are stopped and their sockets removed.
func (m *Manager) Set(resources map[string][]Device) {
	m.mu.Lock()
	changed := false
	for name, devices := range resources {
		ep, ok := m.desired[name]
		if !ok {
			ep = newEndpoint(name, filepath.Join(m.dir, SocketName(name)), m.handler)
			m.desired[name] = ep
			changed = true
		}
		ep.setDevices(devices)
	}
	for name := range m.desired {
		if _, ok := resources[name]; !ok {
			delete(m.desired, name)
			changed = true
		}
	}
	m.mu.Unlock()
	if changed {
		m.trigger()
	}
}

func (m *Manager) trigger() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// Run keeps the endpoints served and registered until ctx ends, then drains
// them (see drain) and returns once every call in flight has finished or the
// drain timeout has passed.
func (m *Manager) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("deviceplugin")
	ctx = klog.NewContext(ctx, logger)
	if err := os.MkdirAll(m.dir, 0o750); err != nil {
		return err
	}
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer func() { _ = watcher.Close() }()
	if err := watcher.Add(m.dir); err != nil {
		return fmt.Errorf("watching %s: %w", m.dir, err)
	}
	if m.watched, err = openDir(m.dir); err != nil {
		return err
	}
	defer func() { m.watched.close() }()
	defer m.stopAll(logger)

	ticker := time.NewTicker(recheckInterval)
	defer ticker.Stop()
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-watcher.Events:
			if !ok {
				return errors.New("file-system watch closed")
			}
			logger.V(4).Info("plugin directory changed", "event", ev.String())
		case err, ok := <-watcher.Errors:
			if !ok {
				return errors.New("file-system watch closed")
			}
			logger.Error(err, "watching the plugin directory")
		case <-m.kick:
		case <-ticker.C:
		case <-retry.C:
		}
		m.followDir(logger, watcher)
		if next := m.reconcile(ctx); !next.IsZero() {
			retry.Reset(time.Until(next))
		}
	}
}

// Orphaned returns an error while the plugin directory is orphaned: deleted,
// and still what this process sees at its path, as a container whose
// hostPath mount is that directory does; the kubelet never looks there, and
// only a restart of the container, which mounts the new one, helps.
func (m *Manager) Orphaned() error {
	if m.orphaned.Load() {
		return fmt.Errorf("the device-plugin directory %s was deleted and this container still sees the deleted one (its mount), where the kubelet never looks: a restart mounts the new one", m.dir)
	}
	return nil
}

// followDir notices the directory replaced (watch the new one: its endpoints
// are served and registered there by the reconcile that follows, their old
// sockets being gone with the old directory), removed (wait for it: the
// recheck ticker looks again) or orphaned (Orphaned).
func (m *Manager) followDir(logger klog.Logger, watcher *fsnotify.Watcher) {
	change, err := m.watched.change()
	if err != nil {
		logger.Error(err, "checking the plugin directory")
		return
	}
	switch change {
	case dirSame:
		m.orphaned.Store(false)
	case dirRemoved:
		logger.V(2).Info("the plugin directory is gone; waiting for it to be made again", "dir", m.dir)
	case dirOrphaned:
		if !m.orphaned.Swap(true) {
			logger.Error(m.Orphaned(), "endpoints unreachable")
		}
	case dirReplaced:
		next, err := openDir(m.dir)
		if err != nil {
			logger.Error(err, "opening the new plugin directory")
			return
		}
		_ = watcher.Remove(m.dir) // the old watch ended with its directory
		if err := watcher.Add(m.dir); err != nil {
			next.close()
			logger.Error(err, "watching the new plugin directory")
			return
		}
		m.watched.close()
		m.watched = next
		m.orphaned.Store(false)
		logger.Info("the plugin directory was replaced; serving and registering there", "dir", m.dir, "endpoints", len(m.running))
		for _, s := range m.running {
			s.stop()
			s.retryAt = time.Time{}
		}
	}
}

// reconcile brings the running servers to the desired ones; it returns when
// the next retry is due, zero if none is.
func (m *Manager) reconcile(ctx context.Context) time.Time {
	logger := klog.FromContext(ctx)
	m.mu.Lock()
	desired := maps.Clone(m.desired)
	m.mu.Unlock()

	for name, s := range m.running {
		if desired[name] != s.ep {
			logger.Info("stopping endpoint; calls in flight may finish", "resource", name, "drainTimeout", m.drainTimeout)
			m.drain(logger, s)
			delete(m.running, name)
		}
	}
	kubelet := inode(filepath.Join(m.dir, KubeletSocket))
	if kubelet != m.kubelet {
		// A new kubelet: whatever failed against the old one is tried now.
		m.kubelet = kubelet
		for _, s := range m.running {
			s.retryAt = time.Time{}
		}
	}
	var next time.Time
	now := time.Now()
	for _, name := range slices.Sorted(maps.Keys(desired)) {
		s := m.running[name]
		if s == nil {
			s = &server{ep: desired[name]}
			m.running[name] = s
		}
		if now.Before(s.retryAt) {
			next = earliest(next, s.retryAt)
			continue
		}
		err := m.ensure(ctx, s, kubelet)
		if err != nil {
			s.failures++
			delay := min(time.Second<<min(s.failures-1, 5), maxBackoff)
			s.retryAt = now.Add(delay)
			next = earliest(next, s.retryAt)
			logger.Error(err, "endpoint not ready", "resource", name, "retryIn", delay)
		} else {
			s.failures, s.retryAt = 0, time.Time{}
		}
	}
	return next
}

// ensure starts s if it is not serving on its socket, and registers it with the
// kubelet whose kubelet.sock is the file kubelet, unless it already did.
func (m *Manager) ensure(ctx context.Context, s *server, kubelet fileID) error {
	logger := klog.FromContext(ctx)
	if !s.serving() {
		if s.grpc != nil {
			logger.Info("restarting endpoint: its server stopped or its socket was removed", "resource", s.ep.resource)
			s.stop()
			if m.observer.Restarted != nil {
				m.observer.Restarted(s.ep.resource)
			}
		}
		if err := s.start(logger); err != nil {
			return err
		}
		if err := confirm(ctx, s.ep.socket); err != nil {
			if ctx.Err() != nil {
				// Stopping, not failing: stopAll drains the server, and a
				// call that reached it already (a kubelet's Allocate) is
				// answered rather than cut.
				return ctx.Err()
			}
			s.stop()
			return fmt.Errorf("endpoint does not answer on its own socket: %w", err)
		}
		logger.V(2).Info("serving", "resource", s.ep.resource, "socket", s.ep.socket)
	}
	if kubelet == (fileID{}) || s.kubelet == kubelet {
		return nil
	}
	err := register(ctx, filepath.Join(m.dir, KubeletSocket), s.ep)
	if m.observer.Registered != nil {
		m.observer.Registered(s.ep.resource, err)
	}
	if err != nil {
		return fmt.Errorf("registering with the kubelet: %w", err)
	}
	s.kubelet = kubelet
	logger.Info("registered with the kubelet", "resource", s.ep.resource)
	return nil
}

// stopAll drains every running endpoint at once and waits for them, and for
// those removed earlier that are still draining.
func (m *Manager) stopAll(logger klog.Logger) {
	if len(m.running) > 0 {
		logger.Info("stopping every endpoint; calls in flight may finish", "endpoints", len(m.running), "drainTimeout", m.drainTimeout)
	}
	for name, s := range m.running {
		m.drain(logger, s)
		delete(m.running, name)
	}
	m.draining.Wait()
}

// drain stops s for good without failing the kubelet's calls in flight. At
// once, in the caller's goroutine (the only one that creates sockets), it
// removes s's socket, so that no new connection reaches it. Then, in the
// background, the gRPC server refuses new calls on the connections it has
// (GOAWAY) and lets the unary calls running (an Allocate waiting for its pod)
// finish, up to the drain timeout; only then do its ListAndWatch streams end:
// the kubelet closes its connection to a plugin whose stream ended, which
// would cancel those calls. Calls still running at the timeout are
// cancelled. m.draining counts the drain until it is over.
func (m *Manager) drain(logger klog.Logger, s *server) {
	if s.grpc == nil {
		s.ep.stop()
		return
	}
	if inode(s.ep.socket) == s.ino {
		_ = os.Remove(s.ep.socket)
	}
	srv, done, ep := s.grpc, s.done, s.ep
	s.grpc, s.kubelet = nil, fileID{}
	m.draining.Add(1)
	go func() {
		defer m.draining.Done()
		timer := time.NewTimer(m.drainTimeout)
		defer timer.Stop()
		graceful := make(chan struct{})
		go func() { srv.GracefulStop(); close(graceful) }()
		select {
		case <-ep.calls.idle():
			ep.stop()
			select {
			case <-graceful:
				logger.V(2).Info("endpoint stopped; no call was cut short", "resource", ep.resource)
			case <-timer.C:
				srv.Stop()
			}
		case <-timer.C:
			logger.Info("endpoint stopped; calls still running after the drain timeout were cancelled", "resource", ep.resource, "drainTimeout", m.drainTimeout)
			ep.stop()
			srv.Stop()
		}
		<-graceful
		<-done
	}()
}

// serving: the server runs and its socket file is the one it listens on.
func (s *server) serving() bool {
	if s.grpc == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
	}
	return inode(s.ep.socket) == s.ino
}

func (s *server) start(logger klog.Logger) error {
	if err := os.Remove(s.ep.socket); err != nil && !os.IsNotExist(err) {
		return err
	}
	l, err := net.Listen("unix", s.ep.socket)
	if err != nil {
		return err
	}
	// The socket is removed by stop and drain, and only while it is still
	// this server's: a server draining in the background must not unlink the
	// socket of its successor at the same path, as closing the listener
	// would by default.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	s.ino = inode(s.ep.socket)
	s.grpc = s.ep.newServer(logger)
	s.done = make(chan struct{})
	s.kubelet = fileID{}
	srv, done := s.grpc, s.done
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	return nil
}

// stop stops the server and removes its socket, unless the file is no longer
// its own (a restarted kubelet may have replaced the directory's contents).
func (s *server) stop() {
	if s.grpc == nil {
		return
	}
	s.grpc.Stop()
	<-s.done
	if inode(s.ep.socket) == s.ino {
		_ = os.Remove(s.ep.socket)
	}
	s.grpc, s.kubelet = nil, fileID{}
}

// confirm dials socket and calls GetDevicePluginOptions, as the kubelet will.
func confirm(ctx context.Context, socket string) error {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, confirmTimeout)
	defer cancel()
	_, err = pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	return err
}

func register(ctx context.Context, kubeletSocket string, ep *endpoint) error {
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(ep.socket),
		ResourceName: ep.resource,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	return err
}

// fileID tells one file from another at the same path: a file system may give a
// re-created file the inode number of the deleted one, not its change time.
type fileID struct {
	ino   uint64
	ctime int64
}

// inode identifies the file at path; zero if it does not exist.
func inode(path string) fileID {
	fi, err := os.Stat(path)
	if err != nil {
		return fileID{}
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fileID{ino: st.Ino, ctime: st.Ctim.Nano()}
	}
	return fileID{}
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}
