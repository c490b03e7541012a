// Package mpsstate is the file through which the MPS control DaemonSet
// (docs/sharing.md, "Where the MPS control daemon runs") tells the node agent
// whether a GPU's MPS control daemon runs: <dir>/<GPU UUID>/state, a small
// JSON object. The DaemonSet writes it (Write) after every probe of the
// daemon; the agent reads it (Read) at every publish pass and gives a GPU in
// MPS mode no new share unless it says Running and is fresh.
//
// The two run in different pods and are upgraded apart, so the format is
// kept to a few fields that both ends check: unknown fields are ignored, and
// a state that does not parse counts as "not running".
package mpsstate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/resclass/resclass/pkg/internal/sealed"
)

// DefaultDir is where the daemons' pipe and log directories and their state
// files are, on the host: <DefaultDir>/<GPU UUID>/{pipe,log,state}, and the
// clients' shared /dev/shm at <DefaultDir>/shm.
const DefaultDir = "/run/resclass/mps"

// FileName is the state file's name in a GPU's directory.
const FileName = "state"

// PipeDir and ShmDir are the daemon's pipe directory (in a GPU's directory)
// and the clients' /dev/shm (in DefaultDir), which a container given an MPS
// share mounts.
const (
	PipeDir = "pipe"
	ShmDir  = "shm"
)

// StaleAfter is how old a Running state may be before the agent stops
// believing it: a DaemonSet pod that died leaves its last state behind. The
// writer rewrites the state at every probe, at least every StaleAfter/3.
const StaleAfter = 3 * time.Minute

// maxBytes bounds what is read: a state is a few hundred bytes.
const maxBytes = 4096

// maxMessage bounds a state's message as the agent republishes it.
const maxMessage = 256

// Phase is what the daemon of a GPU is doing.
type Phase string

// The phases. Only Running serves clients.
const (
	Running  Phase = "Running"
	Starting Phase = "Starting"
	Stopped  Phase = "Stopped"
	Failed   Phase = "Failed"
)

// State is one GPU's state file.
type State struct {
	Phase Phase `json:"phase"`
	// Message says why the daemon is not running, or anything worth knowing.
	Message string `json:"message,omitempty"`
	// Updated is when the writer last probed the daemon.
	Updated time.Time `json:"updated"`
}

// Path is a GPU's state file below dir; an error for a UUID that is not one
// path element (a GPU UUID never is anything else).
func Path(dir, uuid string) (string, error) {
	if uuid == "" || uuid == "." || uuid == ".." || strings.ContainsAny(uuid, "/\\\x00") {
		return "", fmt.Errorf("%q is not a GPU UUID", uuid)
	}
	return filepath.Join(dir, uuid, FileName), nil
}

// Read reads a GPU's state below dir (the DaemonSet's --mps-dir, below the
// reader's host root). A missing file is an error satisfying
// errors.Is(err, fs.ErrNotExist): no daemon was started for the GPU yet.
func Read(dir, uuid string) (State, error) {
	p, err := Path(dir, uuid)
	if err != nil {
		return State{}, err
	}
	f, err := os.Open(p)
	if err != nil {
		return State{}, err
	}
	defer func() { _ = f.Close() }()
	b, err := io.ReadAll(io.LimitReader(f, maxBytes+1))
	if err != nil {
		return State{}, err
	}
	return Parse(b)
}

// Parse decodes a state file.
func Parse(b []byte) (State, error) {
	if len(b) > maxBytes {
		return State{}, fmt.Errorf("state is larger than %d bytes", maxBytes)
	}
	var s State
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&s); err != nil {
		return State{}, fmt.Errorf("state: %w", err)
	}
	if dec.More() {
		return State{}, errors.New("state: more than one JSON value")
	}
	switch s.Phase {
	case Running, Starting, Stopped, Failed:
	default:
		return State{}, fmt.Errorf("state: phase %.32q is none of Running, Starting, Stopped, Failed", string(s.Phase))
	}
	if len(s.Message) > maxMessage {
		s.Message = s.Message[:maxMessage] + "…"
	}
	return s, nil
}

// Serving says whether s lets the GPU take new clients at now, and if not,
// why, in words for Device.Sharing.Message.
func (s State) Serving(now time.Time) (bool, string) {
	if s.Phase != Running {
		why := "the MPS control daemon is " + strings.ToLower(string(s.Phase))
		if s.Message != "" {
			why += ": " + s.Message
		}
		return false, why
	}
	if now.Sub(s.Updated) > StaleAfter {
		// The time written, not the age: the message is published, and
		// must not change at every pass while nothing does.
		return false, fmt.Sprintf("the MPS control daemon's state was last written at %s, more than %s ago: its DaemonSet pod is not probing it", s.Updated.UTC().Format(time.RFC3339), StaleAfter)
	}
	return true, ""
}

// Write writes a GPU's state below dir, atomically (sealed.WriteFile: a
// reader sees the old file or the new one), making the GPU's directory if
// needed.
func Write(dir, uuid string, s State) error {
	p, err := Path(dir, uuid)
	if err != nil {
		return err
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return sealed.WriteFile(p, b)
}
