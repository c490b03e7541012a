package sealed

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The files themselves: read within a bound, written whole or not at all,
// and set aside, not deleted and not fatal, when they cannot be believed.

// ReadFile reads at most maxBytes+1 bytes of path: enough for Unmarshal to
// refuse a file over its bound without reading all of it.
func ReadFile(path string, maxBytes int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	return io.ReadAll(io.LimitReader(f, int64(maxBytes)+1))
}

// WriteFile writes blob to path atomically (a temporary file beside it,
// synced, renamed over it), readable and writable by its owner only: a crash
// leaves the old file or the new one.
func WriteFile(path string, blob []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(blob); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// A file that cannot be believed is renamed <file>.corrupt-<time>, for
// whoever looks into it, and the newest MaxSetAside of those are kept, so
// that a file corrupted at every start does not fill the directory.
const (
	SetAsideSuffix = ".corrupt-"
	MaxSetAside    = 3
	// setAsideTime sorts as it reads.
	setAsideTime = "20060102T150405.000000000Z"
)

// SetAside renames path to path.corrupt-<now> and prunes the older ones
// beside it; it returns the new name.
func SetAside(path string, now time.Time) (string, error) {
	as := path + SetAsideSuffix + now.UTC().Format(setAsideTime)
	if err := os.Rename(path, as); err != nil {
		return "", err
	}
	pruneSetAside(path)
	return as, nil
}

// pruneSetAside deletes all but the newest MaxSetAside files set aside
// beside path. Best effort: what it cannot delete stays.
func pruneSetAside(path string) {
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return
	}
	prefix := filepath.Base(path) + SetAsideSuffix
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) && e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	for len(names) > MaxSetAside {
		_ = os.Remove(filepath.Join(filepath.Dir(path), names[0]))
		names = names[1:]
	}
}
