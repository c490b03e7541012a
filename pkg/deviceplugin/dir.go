package deviceplugin

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// The kubelet's device-plugin directory can be deleted and made again under
// the agent (a node's kubelet state wiped and the kubelet restarted). Two
// cases, told apart by holding the directory open, so that its inode cannot
// be reused while the agent watches it:
//
//   - replaced: the path names a new directory (the agent sees the host's
//     directory through a parent): the agent watches the new one and serves
//     and registers its endpoints there.
//   - orphaned: the path still names the deleted directory, which is what a
//     container whose hostPath mount is that very directory sees: the kubelet
//     never looks there again, and nothing but a new mount, a restart of the
//     container, helps. Manager.Orphaned says so (the agent's /healthz).

// dirChange is what became of the watched directory.
type dirChange int

const (
	dirSame     dirChange = iota // still the directory held open
	dirReplaced                  // the path names another directory
	dirRemoved                   // deleted, and the path names nothing yet
	dirOrphaned                  // deleted, and the path still names it
)

// watchedDir is the directory held open.
type watchedDir struct {
	path string
	f    *os.File
}

func openDir(path string) (*watchedDir, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	return &watchedDir{path: path, f: f}, nil
}

func (d *watchedDir) close() { _ = d.f.Close() }

// change says what became of the directory since it was opened.
func (d *watchedDir) change() (dirChange, error) {
	var held syscall.Stat_t
	if err := syscall.Fstat(int(d.f.Fd()), &held); err != nil {
		return dirSame, fmt.Errorf("%s: %w", d.path, err)
	}
	if held.Nlink > 0 {
		return dirSame, nil
	}
	var now syscall.Stat_t
	err := syscall.Stat(d.path, &now)
	switch {
	case errors.Is(err, syscall.ENOENT):
		return dirRemoved, nil
	case err != nil:
		return dirSame, fmt.Errorf("%s: %w", d.path, err)
	case now.Dev == held.Dev && now.Ino == held.Ino:
		return dirOrphaned, nil
	}
	return dirReplaced, nil
}
