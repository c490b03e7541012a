package kubectlplugin

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/resclass/resclass/pkg/internal/watchdog"
	"github.com/resclass/resclass/pkg/selector"
)

const bigGPUs = `apiVersion: resclass.io/v1alpha1
kind: ResourceClass
metadata:
  name: big-gpus
spec:
  resourceSelector:
  - matchExpressions:
    - {key: kind, operator: In, values: [nvidia-gpu]}
    - {key: memory, operator: GtEq, values: ["30G"]}
`

func TestReadClass(t *testing.T) {
	rc, err := readClass([]byte(bigGPUs))
	if err != nil || rc.Name != "big-gpus" || len(rc.Spec.ResourceSelector) != 1 {
		t.Fatalf("readClass: %+v, %v", rc, err)
	}
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "  \n", "empty"},
		{"other kind", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", `want resclass.io/v1alpha1 ResourceClass`},
		{"unknown field", strings.Replace(bigGPUs, "spec:", "spec:\n  nodeSelector: {}", 1), `unknown field "nodeSelector"`},
		{"no name", strings.Replace(bigGPUs, "name: big-gpus", "labels: {}", 1), "metadata.name: Required value"},
		{"bad name", strings.Replace(bigGPUs, "name: big-gpus", "name: Big_GPUs", 1), "metadata.name: Invalid value"},
		{"bad selector", strings.Replace(bigGPUs, `"30G"`, `"lots"`, 1), "spec.resourceSelector[0].matchExpressions[1].values[0]"},
		{"too big", bigGPUs + "#" + strings.Repeat("x", maxClassFile), "more than"},
	} {
		if _, err := readClass([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

// FuzzReadClass: readClass never panics or hangs, and what it accepts is a
// named ResourceClass whose selectors compile.
func FuzzReadClass(f *testing.F) {
	for _, s := range []string{
		bigGPUs,
		`{"apiVersion":"resclass.io/v1alpha1","kind":"ResourceClass","metadata":{"name":"a"},"spec":{"resourceSelector":[{"matchExpressions":[{"key":"id","operator":"Exists"}]}]}}`,
		"a: &a [*a, *a]\nb: &b [*a, *a]\n",
		"apiVersion: resclass.io/v1alpha1\nkind: ResourceClass\nmetadata: {name: x}\nspec: {resourceSelector: [{matchExpressions: [{key: memory, operator: Gt, values: [1e999999999]}]}]}\n",
		`[]`, `null`, ``, `{`, "---\n---\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		watchdog.Run(t, func() {
			rc, err := readClass(data)
			if (rc == nil) == (err == nil) {
				t.Fatalf("readClass returned %v and %v", rc, err)
			}
			if rc == nil {
				return
			}
			if rc.Name == "" {
				t.Fatal("accepted a class without a name")
			}
			if _, errs := selector.Compile(&rc.Spec, field.NewPath("spec")); len(errs) > 0 {
				t.Fatalf("accepted a class that does not compile: %v", errs)
			}
		})
	})
}
