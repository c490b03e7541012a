package gpuisolation

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/resclass/resclass/pkg/internal/watchdog"
)

func TestParseRuntimeConfig(t *testing.T) {
	for _, tc := range []struct {
		file string
		// want, when the file parses; wantErr, a part of the error when not.
		want    RuntimeConfig
		wantErr string
	}{
		{file: "package-default.toml", want: RuntimeConfig{AcceptEnvVarUnprivileged: true, AcceptEnvVarDefaulted: true, Mode: "auto", AnnotationPrefixes: []string{"cdi.k8s.io/"}}},
		{file: "gpu-operator.toml", want: RuntimeConfig{AcceptEnvVarUnprivileged: true, Mode: "cdi", AnnotationPrefixes: []string{"cdi.k8s.io/", "nvidia.cdi.k8s.io/"}}},
		{file: "hardened.toml", want: RuntimeConfig{AcceptVolumeMounts: true, Mode: "cdi", AnnotationPrefixes: []string{}}},
		{file: "dotted-keys.toml", want: RuntimeConfig{Mode: "cdi", AnnotationPrefixes: []string{"cdi.k8s.io/"}}},
		{file: "misplaced-key.toml", want: RuntimeConfig{AcceptEnvVarUnprivileged: true, AcceptEnvVarDefaulted: true, Mode: "auto", AnnotationPrefixes: []string{"cdi.k8s.io/"}}},
		{file: "wrong-type.toml", wantErr: KeyAcceptEnvVarUnprivileged + " is a string, want a boolean"},
		{file: "wrong-table.toml", wantErr: "nvidia-container-runtime is an array of tables, want a table"},
		{file: "duplicate-key.toml", wantErr: "not valid TOML"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseRuntimeConfig(data)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.AcceptEnvVarUnprivileged != tc.want.AcceptEnvVarUnprivileged || got.AcceptEnvVarDefaulted != tc.want.AcceptEnvVarDefaulted ||
				got.AcceptVolumeMounts != tc.want.AcceptVolumeMounts || got.Mode != tc.want.Mode || !slices.Equal(got.AnnotationPrefixes, tc.want.AnnotationPrefixes) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// hostile are inputs built to make a parser slow, deep or confused. None may
// parse as refusing the variable, and each must cost little.
func hostile() map[string][]byte {
	const depth = MaxRuntimeConfigSize/2 - 8
	return map[string][]byte{
		"binary":               {0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0xff, 0xfe, '\n', '=', 0},
		"nul in a key":         []byte("accept-nvidia-visible-devices-envvar-when-unprivileged\x00 = false\n"),
		"nested arrays":        []byte("x = " + strings.Repeat("[", depth) + strings.Repeat("]", depth) + "\n"),
		"nested inline table":  []byte("x = " + strings.Repeat("{a=", depth/3) + "1" + strings.Repeat("}", depth/3) + "\n"),
		"unclosed arrays":      []byte("x = " + strings.Repeat("[", MaxRuntimeConfigSize-8)),
		"deep dotted key":      []byte(strings.Repeat("a.", MaxRuntimeConfigSize/2-8) + "a = 1\n"),
		"many tables":          bytes.Repeat([]byte("[[t]]\n"), MaxRuntimeConfigSize/6),
		"long string":          []byte("x = \"" + strings.Repeat("\\u0041", MaxRuntimeConfigSize/6-2) + "\"\n"),
		"integer as bool":      []byte(KeyAcceptEnvVarUnprivileged + " = 0\n"),
		"array as bool":        []byte(KeyAcceptEnvVarUnprivileged + " = [false]\n"),
		"bool of other case":   []byte(KeyAcceptEnvVarUnprivileged + " = False\n"),
		"prefixes not strings": []byte(KeyAcceptEnvVarUnprivileged + " = false\n[nvidia-container-runtime.modes.cdi]\nannotation-prefixes = [1, 2]\n"),
		"mode a table":         []byte(KeyAcceptEnvVarUnprivileged + " = false\n[nvidia-container-runtime.mode]\nx = 1\n"),
		"one over the limit":   append([]byte(KeyAcceptEnvVarUnprivileged+" = false\n"), bytes.Repeat([]byte("#"), MaxRuntimeConfigSize)...),
	}
}

func TestParseRuntimeConfigHostile(t *testing.T) {
	for name, data := range hostile() {
		t.Run(name, func(t *testing.T) {
			watchdog.Run(t, func() {
				c, err := ParseRuntimeConfig(data)
				if err == nil && !c.AcceptEnvVarUnprivileged {
					t.Fatalf("parsed as refusing the variable: %+v", c)
				}
				if err != nil && len(err.Error()) > 2*maxExcerpt {
					t.Errorf("error of %d bytes", len(err.Error()))
				}
				t.Logf("%v", err)
			})
		})
	}
	// Exactly the limit is still read.
	data := append([]byte(KeyAcceptEnvVarUnprivileged+" = false\n"), bytes.Repeat([]byte("#"), MaxRuntimeConfigSize)...)[:MaxRuntimeConfigSize]
	if c, err := ParseRuntimeConfig(data); err != nil || c.AcceptEnvVarUnprivileged {
		t.Errorf("a hardened file of exactly %d bytes: %+v, %v", MaxRuntimeConfigSize, c, err)
	}
}

func FuzzParseRuntimeConfig(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.toml")
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, data := range hostile() {
		if len(data) < 4096 {
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		watchdog.Run(t, func() {
			c, err := ParseRuntimeConfig(data)
			if err != nil {
				if len(err.Error()) > 2*maxExcerpt {
					t.Fatalf("error of %d bytes", len(err.Error()))
				}
				return
			}
			if c.AcceptEnvVarDefaulted && !c.AcceptEnvVarUnprivileged {
				t.Fatalf("the absent key's default is true: %+v", c)
			}
			// Refusing needs the key's words in the file: no other spelling
			// of TOML may be taken for it, unless escaped in a quoted key.
			if !c.AcceptEnvVarUnprivileged && !bytes.Contains(data, []byte(KeyAcceptEnvVarUnprivileged)) && !bytes.Contains(data, []byte(`\u`)) && !bytes.Contains(data, []byte(`\U`)) {
				t.Fatalf("refusing without the key: %q", data)
			}
		})
	})
}

func TestReadRuntimeConfig(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "etc/nvidia-container-runtime")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	hardened, err := os.ReadFile("testdata/hardened.toml")
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/nvidia-container-runtime/config.toml", hardened)
	write("usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml", hardened)
	write("etc/large.toml", bytes.Repeat([]byte("#"), MaxRuntimeConfigSize+1))
	if err := os.Mkdir(filepath.Join(root, "etc/a-directory"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "etc/fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	// An absolute link, as the host reads it: to the host's file, which the
	// agent finds below the host root.
	if err := os.Symlink("/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml", filepath.Join(root, "etc/linked.toml")); err != nil {
		t.Fatal(err)
	}
	// A link that climbs out of the host root stays in it.
	if err := os.Symlink("../../../../../../../../.."+filepath.Join(root, "etc/nvidia-container-runtime/config.toml"), filepath.Join(root, "etc/escape.toml")); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		path string
		want FileStatus
		err  string
	}{
		{PackageRuntimeConfig, FileRead, ""},
		{GPUOperatorRuntimeConfig, FileRead, ""},
		{"/etc/linked.toml", FileRead, ""},
		{"/etc/escape.toml", FileNotFound, "no such file"},
		{"/etc/missing.toml", FileNotFound, "no such file"},
		{"/etc/missing-dir/config.toml", FileNotFound, "no such file"},
		{"/etc/nvidia-container-runtime/config.toml/x", FileUnreadable, "not a directory"},
		{"/etc/a-directory", FileUnreadable, "a directory, not a file"},
		{"/etc/fifo", FileUnreadable, "a named pipe, not a file"},
		{"/etc/large.toml", FileInvalid, "larger than"},
		{"etc/nvidia-container-runtime/config.toml", FileUnreadable, "not an absolute host path"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			watchdog.Run(t, func() {
				f := ReadRuntimeConfig(root, tc.path)
				if f.Status != tc.want || (tc.err != "" && (f.Err == nil || !strings.Contains(f.Err.Error(), tc.err))) {
					t.Fatalf("%s: %s, %v; want %s with %q", tc.path, f.Status, f.Err, tc.want, tc.err)
				}
				if f.Status == FileRead && f.Config.AcceptEnvVarUnprivileged {
					t.Errorf("%s: the hardened file reads as accepting", tc.path)
				}
			})
		})
	}

	// No case for a file of mode 0000: the tests run as root (CI, make
	// test), which reads it anyway, so such a case would only ever skip. A
	// refused open takes the same branch of ReadRuntimeConfig as the
	// failures above (any error but not-found and too-large is
	// FileUnreadable).
}

func TestCheckStructure(t *testing.T) {
	for _, tc := range []struct {
		data string
		ok   bool
	}{
		{"a = [[1], [2]]\n[t.u.v]\nx = {y = {z = 1}}\n", true},
		{"x = \"" + strings.Repeat("[", 100) + "\"\n", true},
		{"x = '" + strings.Repeat("{", 100) + "'\n", true},
		{"x = \"\"\"\n" + strings.Repeat("[", 100) + "\n\"\"\"\n", true},
		{"x = '''" + strings.Repeat("[", 100) + "'''\n", true},
		{"x = \"\\\"" + strings.Repeat("[", 100) + "\"\n", true},
		{"# " + strings.Repeat("[.", 100) + "\nx = 1\n", true},
		{"x = \"\"\"a\"\"\"\"\" # " + strings.Repeat("[", 100) + "\n", true},
		{"x = " + strings.Repeat("[", maxNesting) + strings.Repeat("]", maxNesting) + "\n", true},
		{"x = " + strings.Repeat("[", maxNesting+1) + strings.Repeat("]", maxNesting+1) + "\n", false},
		{strings.Repeat("]", 100) + strings.Repeat("[", maxNesting+1), false},
		// A string that the end of its line ends: what follows is structure.
		{"x = \"abc\n" + strings.Repeat("{", maxNesting+1), false},
		{"x = 'abc\n" + strings.Repeat("{", maxNesting+1), false},
		{strings.Repeat("a.", maxDots) + "a = 1\n", true},
		{strings.Repeat("a.", maxDots+1) + "a = 1\n", false},
		{"x = \"" + strings.Repeat(".", 1000) + "\"\n", true},
	} {
		if err := checkStructure([]byte(tc.data)); (err == nil) != tc.ok {
			t.Errorf("%.60q: %v, want ok=%v", tc.data, err, tc.ok)
		}
	}
}
