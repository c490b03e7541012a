// Package sealed is the envelope of the files the node agent keeps on its
// node and must not believe blindly (the DRA checkpoint, the MIG ownership
// record): a version, the SHA-256 of the data, and the data, read strictly,
// so that a torn, edited or foreign file is refused with the reason rather
// than half-read.
package sealed

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// file is the envelope's layout.
type file struct {
	Version  string          `json:"version"`
	Checksum string          `json:"checksum"`
	Data     json.RawMessage `json:"data"`
}

// Marshal renders v as JSON in an envelope of version with its checksum.
func Marshal(version string, v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	return json.Marshal(file{Version: version, Checksum: hex.EncodeToString(sum[:]), Data: data})
}

// Unmarshal reads into v what Marshal wrote with version, refusing with a
// reason a blob over maxBytes, another version, a checksum that does not
// match, unknown fields or anything after the JSON. The caller checks what
// the data says.
func Unmarshal(blob []byte, version string, maxBytes int, v any) error {
	if len(blob) > maxBytes {
		return fmt.Errorf("%d bytes, at most %d", len(blob), maxBytes)
	}
	var f file
	if err := Strict(blob, &f); err != nil {
		return err
	}
	if f.Version != version {
		return fmt.Errorf("version %.64q, want %q", f.Version, version)
	}
	sum := sha256.Sum256(f.Data)
	if f.Checksum != hex.EncodeToString(sum[:]) {
		return errors.New("checksum does not match its data (torn or edited file)")
	}
	if err := Strict(f.Data, v); err != nil {
		return fmt.Errorf("data: %w", err)
	}
	return nil
}

// Strict decodes one JSON value into v: unknown fields and trailing data are
// errors.
func Strict(blob []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(blob))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON object")
	}
	return nil
}
