package nvml

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRequiredSymbolsAreWhatGoNVMLCalls keeps requiredSymbols honest in both
// directions, from the sources: the C functions that the go-nvml methods this
// package calls reach (read from go-nvml's source in the module cache, with
// the versioned fallbacks go-nvml chooses between at load) must each be
// required — one missing is the crash the check exists to prevent ("undefined
// symbol") — and each required entry must be one of them, or a real driver
// lacking an unused function would be refused.
//
// Methods are matched by name, on the go-nvml types this package holds
// (receivers): the library, devices (GPUs and MIG devices), event sets, GPU
// instances, and Return (its Error). go-nvml has methods of the same names on
// types this package never has (vGPU instances, GPM samples, compute
// instances), which are not counted.
func TestRequiredSymbolsAreWhatGoNVMLCalls(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		t.Fatalf("go list -m github.com/NVIDIA/go-nvml: %v", err)
	}
	idx := indexGoNVML(t, filepath.Join(strings.TrimSpace(string(out)), "pkg/nvml"))

	// The method names this package calls.
	called := map[string]bool{}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
					called[sel.Sel.Name] = true
				}
			}
			return true
		})
	}

	got := map[string]bool{}
	for name := range called {
		for _, fn := range idx.methods[name] {
			if !receivers[idx.recv(fn)] {
				continue
			}
			for _, g := range idx.symbols(fn) {
				got[g] = true
			}
		}
	}
	want := map[string]bool{}
	for _, names := range requiredSymbols {
		want[group(names)] = true
	}
	for g := range got {
		if !want[g] {
			t.Errorf("this package reaches the C function %s through go-nvml, but requiredSymbols lacks it: a library without it would end the process", g)
		}
	}
	for g := range want {
		if !got[g] {
			t.Errorf("requiredSymbols has %s, which no go-nvml call of this package reaches: a driver without it would be refused for nothing (or the alternatives differ from go-nvml's)", g)
		}
	}
	if len(got) < 20 {
		t.Fatalf("found only %d C functions; the source walk is broken: %v", len(got), got)
	}
}

// receivers are go-nvml's implementations of the interfaces this package
// uses: lib.Interface, lib.Device, lib.EventSet, lib.GpuInstance, lib.Return.
var receivers = map[string]bool{"library": true, "nvmlDevice": true, "nvmlEventSet": true, "nvmlGpuInstance": true, "nvmlComputeInstance": true, "Return": true}

func group(names []string) string {
	s := slices.Clone(names)
	slices.Sort(s)
	return strings.Join(s, "|")
}

// goNVML indexes go-nvml's declarations.
type goNVML struct {
	methods map[string][]*ast.FuncDecl
	funcs   map[string]*ast.FuncDecl
	// varFuncs: a function variable -> the functions assigned to it (its
	// initial value and what updateVersionedSymbols or load assign).
	varFuncs map[string][]string
}

func indexGoNVML(t *testing.T, dir string) *goNVML {
	t.Helper()
	idx := &goNVML{methods: map[string][]*ast.FuncDecl{}, funcs: map[string]*ast.FuncDecl{}, varFuncs: map[string][]string{}}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") || strings.Contains(e.Name(), "mock") {
			continue
		}
		file, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv != nil {
					idx.methods[d.Name.Name] = append(idx.methods[d.Name.Name], d)
				} else {
					idx.funcs[d.Name.Name] = d
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if vs, ok := s.(*ast.ValueSpec); ok && len(vs.Names) == len(vs.Values) {
						for i, n := range vs.Names {
							if id, ok := vs.Values[i].(*ast.Ident); ok {
								idx.varFuncs[n.Name] = append(idx.varFuncs[n.Name], id.Name)
							}
						}
					}
				}
			}
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if as, ok := n.(*ast.AssignStmt); ok && len(as.Lhs) == len(as.Rhs) {
				for i, l := range as.Lhs {
					lid, ok1 := l.(*ast.Ident)
					rid, ok2 := as.Rhs[i].(*ast.Ident)
					if ok1 && ok2 && idx.varFuncs[lid.Name] != nil && !slices.Contains(idx.varFuncs[lid.Name], rid.Name) {
						idx.varFuncs[lid.Name] = append(idx.varFuncs[lid.Name], rid.Name)
					}
				}
			}
			return true
		})
	}
	return idx
}

func (idx *goNVML) recv(fn *ast.FuncDecl) string {
	typ := fn.Recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// symbols returns the C functions fn reaches, each as a group of
// alternatives ("a|b": whichever go-nvml found at load).
func (idx *goNVML) symbols(fn *ast.FuncDecl) []string {
	var out []string
	seen := map[*ast.FuncDecl]bool{}
	var walk func(fn *ast.FuncDecl)
	// cOf returns the C functions fn calls directly (not the C types it
	// converts to).
	cOf := func(fn *ast.FuncDecl) []string {
		var cs []string
		ast.Inspect(fn, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
					if x, ok := sel.X.(*ast.Ident); ok && x.Name == "C" && strings.HasPrefix(sel.Sel.Name, "nvml") && !strings.HasSuffix(sel.Sel.Name, "_t") {
						cs = append(cs, sel.Sel.Name)
					}
				}
			}
			return true
		})
		return cs
	}
	// use handles a reference to name: a function is walked; a function
	// variable's candidates are alternatives of one another.
	use := func(name string) {
		if cands, ok := idx.varFuncs[name]; ok {
			var alts []string
			for _, c := range cands {
				if f := idx.funcs[c]; f != nil {
					alts = append(alts, cOf(f)...)
				}
			}
			if len(alts) > 0 {
				out = append(out, group(alts))
			}
			return
		}
		if f := idx.funcs[name]; f != nil {
			walk(f)
		}
	}
	walk = func(fn *ast.FuncDecl) {
		if seen[fn] {
			return
		}
		seen[fn] = true
		out = append(out, cOf(fn)...)
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				switch f := n.Fun.(type) {
				case *ast.Ident:
					use(f.Name)
				case *ast.SelectorExpr:
					// Methods go-nvml calls on itself (l.load()); not the
					// versioned-symbol lookups, which only look.
					if x, ok := f.X.(*ast.Ident); ok && x.Name != "C" && f.Sel.Name != "updateVersionedSymbols" && !ast.IsExported(f.Sel.Name) {
						for _, m := range idx.methods[f.Sel.Name] {
							walk(m)
						}
					}
				}
			case *ast.AssignStmt:
				// errorStringFunc = nvmlErrorString in load: Return.Error
				// calls it from then on.
				for _, r := range n.Rhs {
					if id, ok := r.(*ast.Ident); ok && idx.funcs[id.Name] != nil {
						use(id.Name)
					}
				}
			}
			return true
		})
	}
	walk(fn)
	return out
}
