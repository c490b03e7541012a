package quota

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// DefaultInterval is how often a File polls its path when NewFile is given
// no interval.
const DefaultInterval = 10 * time.Second

// File is a configuration file that is reloaded when its content changes.
// It is meant for a mounted ConfigMap, whose files are symlinks through a
// ..data directory link that the kubelet swaps atomically: polling the
// content (rather than watching inodes) sees every swap, at the cost of
// reading a small file every interval.
//
// A change that cannot be read or does not parse leaves the last good
// configuration in place: a typo in the ConfigMap must not turn the webhook
// into one that allows (or denies) everything.
type File struct {
	// OnLoad, if set, is called after each reload attempt that changes
	// something: with the new configuration when one was loaded, or with
	// the error when an attempt failed with a new error (repeated failures
	// with the same error or the same bad content are not reported again).
	// It is not called for NewFile's initial load; read Status after
	// NewFile instead. Set it before Start; it must not call Reload.
	OnLoad func(cfg *Config, err error)

	path     string
	interval time.Duration
	log      logr.Logger

	current atomic.Pointer[Config]

	reloadMu sync.Mutex // serializes Reload
	seen     string     // hash of the content of the last attempt, "" after a read error

	statusMu sync.Mutex
	status   FileStatus
}

// FileStatus is the state of a File, for metrics and debugging.
type FileStatus struct {
	// Generation counts loaded configurations: 1 after NewFile, one more
	// for each successful reload of changed content.
	Generation int64
	// Hash is the hex SHA-256 of the loaded configuration's bytes, "" when
	// no path is configured.
	Hash string
	// LoadedAt is when the current configuration was loaded.
	LoadedAt time.Time
	// Failed reports whether the last reload attempt failed, and Err why;
	// the previous configuration is still in use.
	Failed bool
	Err    error
}

// NewFile loads the configuration at path, or returns an error: a binary
// should refuse to start on a bad configuration. An empty path means no
// limited resources: Current returns an empty Config that allows every pod,
// and nothing is polled. An interval <= 0 means DefaultInterval.
func NewFile(path string, interval time.Duration, log logr.Logger) (*File, error) {
	if interval <= 0 {
		interval = DefaultInterval
	}
	f := &File{path: path, interval: interval, log: log}
	f.status = FileStatus{Generation: 1, LoadedAt: time.Now()}
	if path == "" {
		f.current.Store(&Config{})
		return f, nil
	}
	data, err := readBounded(path)
	if err != nil {
		return nil, fmt.Errorf("reading ResourceQuota configuration: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.seen = hash(data)
	f.current.Store(cfg)
	f.status.Hash = f.seen
	f.logLoaded(cfg)
	return f, nil
}

// Current returns the configuration in use. It is safe for concurrent use
// and cheap enough to call on every request.
func (f *File) Current() *Config {
	return f.current.Load()
}

// Status returns the state of the file.
func (f *File) Status() FileStatus {
	f.statusMu.Lock()
	defer f.statusMu.Unlock()
	return f.status
}

// Reload reads the file and loads it if its content changed. It returns the
// error of the last attempt on this content (nil when the configuration in
// use is this content). Start calls it every interval; call it directly to
// reload sooner, e.g. on SIGHUP.
func (f *File) Reload() error {
	if f.path == "" {
		return nil
	}
	f.reloadMu.Lock()
	defer f.reloadMu.Unlock()

	data, err := readBounded(f.path)
	if err != nil {
		f.seen = ""
		return f.fail(fmt.Errorf("reading ResourceQuota configuration: %w", err))
	}
	sum := hash(data)
	if sum == f.seen {
		return f.Status().Err // same content, same outcome: nothing to report
	}
	f.seen = sum

	st := f.Status()
	if sum == st.Hash {
		// Back to the loaded content after a failed attempt.
		f.setStatus(func(s *FileStatus) { s.Failed, s.Err = false, nil })
		f.log.Info("ResourceQuota configuration file is readable and valid again", "path", f.path, "generation", st.Generation)
		if f.OnLoad != nil {
			f.OnLoad(f.Current(), nil)
		}
		return nil
	}
	cfg, err := Parse(data)
	if err != nil {
		return f.fail(fmt.Errorf("%s: %w", f.path, err))
	}
	f.current.Store(cfg)
	f.setStatus(func(s *FileStatus) {
		*s = FileStatus{Generation: s.Generation + 1, Hash: sum, LoadedAt: time.Now()}
	})
	f.logLoaded(cfg)
	if f.OnLoad != nil {
		f.OnLoad(cfg, nil)
	}
	return nil
}

// MaxFileBytes bounds the configuration file: the apiserver's own is a few
// hundred bytes, and a ConfigMap holds at most 1 MiB.
const MaxFileBytes = 1 << 20

// readBounded reads at most MaxFileBytes of path, refusing a larger file
// rather than parsing part of it.
func readBounded(path string) ([]byte, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = file.Close() }()
	data, err := io.ReadAll(io.LimitReader(file, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, MaxFileBytes)
	}
	return data, nil
}

// Start polls the file every interval until ctx is done, then returns nil.
// It matches controller-runtime's manager.Runnable.
func (f *File) Start(ctx context.Context) error {
	if f.path == "" {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			_ = f.Reload() // reported by fail
		}
	}
}

// fail records a failed attempt and reports it unless it repeats the
// previous failure.
func (f *File) fail(err error) error {
	prev := f.Status()
	f.setStatus(func(s *FileStatus) { s.Failed, s.Err = true, err })
	if prev.Failed && prev.Err.Error() == err.Error() {
		return err
	}
	f.log.Error(err, "Keeping the previous ResourceQuota configuration", "path", f.path, "generation", prev.Generation, "hash", prev.Hash)
	if f.OnLoad != nil {
		f.OnLoad(nil, err)
	}
	return err
}

func (f *File) setStatus(update func(*FileStatus)) {
	f.statusMu.Lock()
	defer f.statusMu.Unlock()
	update(&f.status)
}

func (f *File) logLoaded(cfg *Config) {
	st := f.Status()
	f.log.Info("Loaded ResourceQuota configuration", "path", f.path, "generation", st.Generation, "hash", st.Hash,
		"scopes", fmt.Sprint(cfg.Scopes()), "matchContains", cfg.MatchContains())
	for _, w := range cfg.Warnings() {
		f.log.Info("ResourceQuota configuration: "+w, "path", f.path)
	}
}

func hash(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
