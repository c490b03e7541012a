package draplugin

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// A checkpoint that cannot be believed (it does not parse, its checksum does
// not match, it breaks a bound) is set aside rather than stopping the agent:
// stopping made the agent crash-loop, with the node's DRA claims unserved,
// until someone deleted the file. The file is renamed
// <checkpoint>.corrupt-<time>, for whoever looks into it, and the newest
// maxSetAside of those are kept, so that a file corrupted at every start
// does not fill the directory.
const (
	setAsideSuffix = ".corrupt-"
	maxSetAside    = 3
	// setAsideTime sorts as it reads.
	setAsideTime = "20060102T150405.000000000Z"
)

// SetAside says that the checkpoint at Path could not be believed (Err) and
// was renamed to As; the plugin started with no claims prepared.
type SetAside struct {
	Path, As string
	Err      error
}

func (s *SetAside) Error() string {
	return fmt.Sprintf("checkpoint %s cannot be believed (%v): set aside as %s; started with no claims prepared", s.Path, s.Err, filepath.Base(s.As))
}

// loadOrSetAside reads the checkpoint at path. One that cannot be believed is
// set aside and an empty checkpoint returned with what happened; an error is
// returned only when the file cannot be read or renamed (the directory itself
// is broken, which a restart may fix).
func loadOrSetAside(path string, now time.Time) (*Checkpoint, *SetAside, error) {
	blob, err := readCheckpoint(path)
	if errors.Is(err, os.ErrNotExist) {
		return &Checkpoint{Claims: map[types.UID]PreparedClaim{}}, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	c, perr := ParseCheckpoint(blob)
	if perr == nil {
		return c, nil, nil
	}
	as := path + setAsideSuffix + now.UTC().Format(setAsideTime)
	if err := os.Rename(path, as); err != nil {
		return nil, nil, fmt.Errorf("%s: %w; setting it aside: %w", path, perr, err)
	}
	pruneSetAside(path)
	return &Checkpoint{Claims: map[types.UID]PreparedClaim{}}, &SetAside{Path: path, As: as, Err: perr}, nil
}

// readCheckpoint reads at most one byte more than a checkpoint may have.
func readCheckpoint(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	return io.ReadAll(io.LimitReader(f, maxCheckpointBytes+1))
}

// pruneSetAside deletes all but the newest maxSetAside checkpoints set aside
// beside path. Best effort: what it cannot delete stays.
func pruneSetAside(path string) {
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return
	}
	prefix := filepath.Base(path) + setAsideSuffix
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) && e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	for len(names) > maxSetAside {
		_ = os.Remove(filepath.Join(filepath.Dir(path), names[0]))
		names = names[1:]
	}
}
