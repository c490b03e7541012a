package mpsstate

import (
	"errors"
	"io/fs"
	"strings"
	"testing"
	"time"
)

func TestWriteThenRead(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC)
	if _, err := Read(dir, "GPU-1"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("no file: %v, want not-exist", err)
	}
	if err := Write(dir, "GPU-1", State{Phase: Running, Updated: now}); err != nil {
		t.Fatal(err)
	}
	s, err := Read(dir, "GPU-1")
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := s.Serving(now.Add(time.Minute)); !ok {
		t.Errorf("running and fresh: not serving: %s", why)
	}
	if ok, why := s.Serving(now.Add(StaleAfter + time.Second)); ok || !strings.Contains(why, "last written") {
		t.Errorf("stale: serving %v, %q", ok, why)
	}
	if err := Write(dir, "GPU-1", State{Phase: Failed, Message: "nvidia-cuda-mps-control exited 1", Updated: now}); err != nil {
		t.Fatal(err)
	}
	s, _ = Read(dir, "GPU-1")
	if ok, why := s.Serving(now); ok || why != "the MPS control daemon is failed: nvidia-cuda-mps-control exited 1" {
		t.Errorf("failed: serving %v, %q", ok, why)
	}
}

func TestPathRefusesWhatIsNotAUUID(t *testing.T) {
	for _, id := range []string{"", ".", "..", "../etc", "a/b", "a\x00b"} {
		if _, err := Path("/run/resclass/mps", id); err == nil {
			t.Errorf("Path(%q): no error", id)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for _, in := range []string{``, `{}`, `{"phase":"Dancing"}`, `{"phase":"Running"}{}`, `[1]`, strings.Repeat(" ", maxBytes+1)} {
		if _, err := Parse([]byte(in)); err == nil {
			t.Errorf("Parse(%.40q): no error", in)
		}
	}
}

// FuzzParse: any input parses or is refused, never panics, and what parses
// has a known phase and a bounded message.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"phase":"Running","updated":"2026-11-28T01:00:00Z"}`,
		`{"phase":"Failed","message":"exit 1","updated":"2026-11-28T01:00:00Z","extra":1}`,
		`{"phase":"Stopped"}`, `{"phase":`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 2*maxBytes {
			return
		}
		s, err := Parse(b)
		if err != nil {
			return
		}
		switch s.Phase {
		case Running, Starting, Stopped, Failed:
		default:
			t.Fatalf("phase %q parsed", s.Phase)
		}
		if len(s.Message) > maxMessage+len("…") {
			t.Fatalf("message of %d bytes", len(s.Message))
		}
		_, _ = s.Serving(time.Now())
	})
}
