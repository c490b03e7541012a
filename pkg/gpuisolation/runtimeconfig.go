package gpuisolation

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/BurntSushi/toml"
	securejoin "github.com/cyphar/filepath-securejoin"
)

// The NVIDIA Container Toolkit's configuration file, where its packages put it
// and where the NVIDIA GPU operator's toolkit container does (its runtime
// wrapper points XDG_CONFIG_HOME there). Host paths.
const (
	PackageRuntimeConfig     = "/etc/nvidia-container-runtime/config.toml"
	GPUOperatorRuntimeConfig = "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml"
)

// DefaultRuntimeConfigs are the files the agent reads unless told otherwise:
// both places the toolkit is found, so that a node set up either way is
// checked without configuration.
var DefaultRuntimeConfigs = []string{PackageRuntimeConfig, GPUOperatorRuntimeConfig}

// MaxRuntimeConfigSize bounds what is read of a file. The toolkit's own file
// is under 2 KiB with every comment; a larger one is refused, not read.
const MaxRuntimeConfigSize = 64 << 10

// The toolkit's keys this check reads, as its config.toml spells them.
const (
	KeyAcceptEnvVarUnprivileged = "accept-nvidia-visible-devices-envvar-when-unprivileged"
	KeyAcceptVolumeMounts       = "accept-nvidia-visible-devices-as-volume-mounts"
	tableRuntime                = "nvidia-container-runtime"
	keyMode                     = "mode"
	tableModes                  = "modes"
	tableCDI                    = "cdi"
	keyAnnotationPrefixes       = "annotation-prefixes"
)

// RuntimeConfig is what the check reads of the toolkit's config.toml, with the
// toolkit's own default wherever a key is absent.
type RuntimeConfig struct {
	// AcceptEnvVarUnprivileged is accept-nvidia-visible-devices-envvar-when-unprivileged:
	// whether the runtime gives an unprivileged container the GPUs its
	// NVIDIA_VISIBLE_DEVICES names. The toolkit's default is true.
	AcceptEnvVarUnprivileged bool
	// AcceptEnvVarDefaulted says the key is absent, so the default holds.
	AcceptEnvVarDefaulted bool
	// AcceptVolumeMounts is accept-nvidia-visible-devices-as-volume-mounts
	// (default false): device lists read from /dev/null mounts below
	// /var/run/nvidia-container-devices, which only a hostPath volume can
	// make, so Pod Security's baseline keeps tenants from it.
	AcceptVolumeMounts bool
	// Mode is [nvidia-container-runtime] mode: auto (default), legacy, cdi or csv.
	Mode string
	// AnnotationPrefixes is [nvidia-container-runtime.modes.cdi]
	// annotation-prefixes: the container annotations a runtime in CDI mode
	// reads CDI device names from (default cdi.k8s.io/).
	AnnotationPrefixes []string
}

// ParseRuntimeConfig reads a config.toml. Only the keys above are judged; any
// other content is the toolkit's business, but the whole file must be valid
// TOML, as the toolkit refuses to start containers with one that is not. A
// key of the wrong type is an error naming it: the check cannot know what the
// toolkit would make of it.
func ParseRuntimeConfig(data []byte) (RuntimeConfig, error) {
	c := RuntimeConfig{AcceptEnvVarUnprivileged: true, AcceptEnvVarDefaulted: true, Mode: "auto", AnnotationPrefixes: []string{"cdi.k8s.io/"}}
	if len(data) > MaxRuntimeConfigSize {
		return c, fmt.Errorf("%d bytes, more than the %d this check reads", len(data), MaxRuntimeConfigSize)
	}
	if err := checkStructure(data); err != nil {
		return c, err
	}
	var doc map[string]any
	if _, err := toml.Decode(string(data), &doc); err != nil {
		return c, fmt.Errorf("not valid TOML: %s", excerpt(err.Error()))
	}
	if v, ok := doc[KeyAcceptEnvVarUnprivileged]; ok {
		b, ok := v.(bool)
		if !ok {
			return c, wrongType(KeyAcceptEnvVarUnprivileged, v, "a boolean")
		}
		c.AcceptEnvVarUnprivileged, c.AcceptEnvVarDefaulted = b, false
	}
	if v, ok := doc[KeyAcceptVolumeMounts]; ok {
		b, ok := v.(bool)
		if !ok {
			return c, wrongType(KeyAcceptVolumeMounts, v, "a boolean")
		}
		c.AcceptVolumeMounts = b
	}
	runtime, err := table(doc, tableRuntime, tableRuntime)
	if err != nil {
		return c, err
	}
	if v, ok := runtime[keyMode]; ok {
		s, ok := v.(string)
		if !ok {
			return c, wrongType(tableRuntime+"."+keyMode, v, "a string")
		}
		c.Mode = s
	}
	modes, err := table(runtime, tableModes, tableRuntime+"."+tableModes)
	if err != nil {
		return c, err
	}
	cdi, err := table(modes, tableCDI, tableRuntime+"."+tableModes+"."+tableCDI)
	if err != nil {
		return c, err
	}
	if v, ok := cdi[keyAnnotationPrefixes]; ok {
		name := tableRuntime + "." + tableModes + "." + tableCDI + "." + keyAnnotationPrefixes
		list, ok := v.([]any)
		if !ok {
			return c, wrongType(name, v, "an array of strings")
		}
		c.AnnotationPrefixes = make([]string, 0, len(list))
		for _, e := range list {
			s, ok := e.(string)
			if !ok {
				return c, wrongType(name, v, "an array of strings")
			}
			c.AnnotationPrefixes = append(c.AnnotationPrefixes, s)
		}
	}
	return c, nil
}

// The parser's cost grows faster than the input with nesting and with the
// parts of a dotted key (measured: 64 KiB of "a.a.a...", one key of 32,000
// parts, takes minutes), so the structure is bounded before it parses. The
// toolkit's own file nests two deep and has a handful of dots outside
// strings (its table headers).
const (
	maxNesting = 32
	maxDots    = 256
)

// checkStructure bounds the nesting of arrays and inline tables (and the
// brackets of table headers) and the dots outside strings and comments,
// following TOML's strings and comments: what it counts are the characters
// the parser reads as structure. A single-line string ends at the end of its
// line, as the parser's does (an error there).
func checkStructure(data []byte) error {
	depth, dots := 0, 0
	for i := 0; i < len(data); i++ {
		switch c := data[i]; c {
		case '#':
			for i < len(data) && data[i] != '\n' {
				i++
			}
		case '"', '\'':
			i = skipString(data, i)
		case '[', '{':
			depth++
			if depth > maxNesting {
				return fmt.Errorf("nested more than %d deep (arrays, inline tables)", maxNesting)
			}
		case ']', '}':
			// Never below zero: closers first cannot buy openers later.
			depth = max(depth-1, 0)
		case '.':
			dots++
			if dots > maxDots {
				return fmt.Errorf("more than %d dots outside strings (dotted keys, table names, floats)", maxDots)
			}
		}
	}
	return nil
}

// skipString returns the index of the last byte of the string that opens at
// data[i] (a quote): basic ("...", escapes) or literal ('...'), single- or
// multi-line (three quotes).
func skipString(data []byte, i int) int {
	q := data[i]
	if i+2 < len(data) && data[i+1] == q && data[i+2] == q {
		for j := i + 3; j < len(data); j++ {
			switch {
			case q == '"' && data[j] == '\\':
				j++
			case data[j] == q && j+2 < len(data) && data[j+1] == q && data[j+2] == q:
				// Up to two more quotes belong to the string (""""" ends it
				// with two quotes in it).
				j += 2
				for j+1 < len(data) && data[j+1] == q {
					j++
				}
				return j
			}
		}
		return len(data)
	}
	for j := i + 1; j < len(data); j++ {
		switch {
		case data[j] == '\n':
			return j
		case q == '"' && data[j] == '\\':
			j++
		case data[j] == q:
			return j
		}
	}
	return len(data)
}

// table is doc's table key (nil when absent: the defaults hold).
func table(doc map[string]any, key, name string) (map[string]any, error) {
	v, ok := doc[key]
	if !ok {
		return nil, nil
	}
	t, ok := v.(map[string]any)
	if !ok {
		return nil, wrongType(name, v, "a table")
	}
	return t, nil
}

func wrongType(key string, v any, want string) error {
	return fmt.Errorf("%s is %s, want %s", key, typeName(v), want)
}

// typeName names a decoded TOML value's type as TOML does.
func typeName(v any) string {
	switch v.(type) {
	case bool:
		return "a boolean"
	case string:
		return "a string"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case []any:
		return "an array"
	case map[string]any:
		return "a table"
	case []map[string]any:
		return "an array of tables"
	}
	return "a date or time"
}

// maxExcerpt bounds the parser's words in a condition's message: they may
// quote the file.
const maxExcerpt = 300

func excerpt(s string) string {
	if len(s) <= maxExcerpt {
		return s
	}
	return s[:maxExcerpt] + "..."
}

// FileStatus is how reading one file ended.
type FileStatus string

const (
	// FileRead: parsed; Config holds what it says.
	FileRead FileStatus = "read"
	// FileNotFound: no file at the path on the host.
	FileNotFound FileStatus = "not-found"
	// FileUnreadable: there is something, but not a regular file the agent
	// may read (a directory, a FIFO, no permission).
	FileUnreadable FileStatus = "unreadable"
	// FileInvalid: read, but too large, not TOML, or a key of a wrong type.
	FileInvalid FileStatus = "invalid"
)

// File is one configuration file as the check found it.
type File struct {
	// Path is the host path (below the host root in the agent's container).
	Path   string
	Status FileStatus
	// Config is what it says when Status is FileRead.
	Config RuntimeConfig
	// Err says why not, otherwise.
	Err error
}

// ReadRuntimeConfig reads the host's file at path (a host path), seen below
// hostRoot. Symbolic links are followed within hostRoot, as the host would
// follow them, never out of it. Only a regular file is opened, without
// blocking (a FIFO planted at the path cannot stall the agent), and at most
// MaxRuntimeConfigSize+1 bytes are read.
func ReadRuntimeConfig(hostRoot, path string) File {
	f := File{Path: path}
	if !filepath.IsAbs(path) {
		f.Status, f.Err = FileUnreadable, errors.New("not an absolute host path")
		return f
	}
	data, err := readBounded(hostRoot, path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		f.Status, f.Err = FileNotFound, errors.New("no such file")
		return f
	case errors.Is(err, errTooLarge):
		f.Status, f.Err = FileInvalid, err
		return f
	case err != nil:
		f.Status, f.Err = FileUnreadable, err
		return f
	}
	f.Config, err = ParseRuntimeConfig(data)
	if err != nil {
		f.Status, f.Err = FileInvalid, err
		return f
	}
	f.Status = FileRead
	return f
}

var errTooLarge = fmt.Errorf("larger than the %d bytes this check reads", MaxRuntimeConfigSize)

func readBounded(hostRoot, path string) ([]byte, error) {
	if hostRoot == "" {
		hostRoot = "/"
	}
	full, err := securejoin.SecureJoin(hostRoot, path)
	if err != nil {
		return nil, err
	}
	// Stat first, so that nothing but a regular file is ever opened (opening
	// a device node may act on the device).
	if err := regular(os.Stat(full)); err != nil {
		return nil, err
	}
	// O_NOFOLLOW: SecureJoin resolved the links; one that appears since is
	// refused rather than followed out of the host root.
	file, err := os.OpenFile(full, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer func() { _ = file.Close() }()
	if err := regular(file.Stat()); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(file, MaxRuntimeConfigSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxRuntimeConfigSize {
		return nil, errTooLarge
	}
	return data, nil
}

func regular(fi fs.FileInfo, err error) error {
	if err != nil {
		return err
	}
	switch t := fi.Mode().Type(); {
	case t.IsRegular():
		return nil
	case t&fs.ModeDir != 0:
		return errors.New("a directory, not a file")
	case t&fs.ModeNamedPipe != 0:
		return errors.New("a named pipe, not a file")
	case t&(fs.ModeDevice|fs.ModeCharDevice) != 0:
		return errors.New("a device node, not a file")
	case t&fs.ModeSocket != 0:
		return errors.New("a socket, not a file")
	case t&fs.ModeSymlink != 0:
		return errors.New("a symbolic link that appeared while it was read")
	}
	return errors.New("not a regular file")
}
