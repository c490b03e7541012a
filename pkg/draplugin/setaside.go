package draplugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/resclass/resclass/pkg/internal/sealed"
)

// A checkpoint that cannot be believed (it does not parse, its checksum does
// not match, it breaks a bound) is set aside rather than stopping the agent
// (sealed.SetAside): stopping made the agent crash-loop, with the node's DRA
// claims unserved, until someone deleted the file.

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
	as, err := sealed.SetAside(path, now)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w; setting it aside: %w", path, perr, err)
	}
	return &Checkpoint{Claims: map[types.UID]PreparedClaim{}}, &SetAside{Path: path, As: as, Err: perr}, nil
}

// readCheckpoint reads at most one byte more than a checkpoint may have.
func readCheckpoint(path string) ([]byte, error) {
	return sealed.ReadFile(path, maxCheckpointBytes)
}
