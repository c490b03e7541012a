package webhook

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/attrvalue"
	"github.com/resclass/resclass/pkg/internal/watchdog"
)

// Decoding a quantity with apimachinery costs 10^|exponent|: the root cause of
// FuzzAdmissionReview's stalls. Each object below is decided at once, the
// costly ones refused with the quantity's path, the harmless look-alikes
// decoded.
func TestDecodeBoundsQuantities(t *testing.T) {
	podGVK := corev1.SchemeGroupVersion.WithKind("Pod")
	classGVK := v1alpha1.SchemeGroupVersion.WithKind("ResourceClass")
	pod := func(inner string) string {
		return `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","annotations":{"limits":"1e999999999","x":"2e-99999"}},` +
			`"spec":{"containers":[{"name":"c","env":[{"name":"E","value":"1e-999999999"}],` + inner + `}]}}`
	}
	for _, tc := range []struct {
		name, obj string
		gvk       bool // a ResourceClass, else a Pod
		want      string
	}{
		{"string limit", pod(`"resources":{"limits":{"cpu":"1e-999999999"}}`), false, `spec.containers.resources.limits.cpu: "1e-999999999": the exponent -999999999 is out of range (at most e99`},
		{"number request", pod(`"resources":{"requests":{"memory":1e999999999}}`), false, `spec.containers.resources.requests.memory: "1e999999999": the exponent 999999999 is out of range`},
		{"huge exponent digits", pod(`"resources":{"limits":{"cpu":"1e99999999999999999999999"}}`), false, "out of range"},
		{"long mantissa", pod(`"resources":{"limits":{"cpu":"0.` + strings.Repeat("0", 200) + `1"}}`), false, "a quantity of 203 characters is out of range (at most 128)"},
		{"empty dir", `{"apiVersion":"v1","kind":"Pod","spec":{"volumes":[{"name":"v","emptyDir":{"sizeLimit":"1E-12345"}}]}}`, false, "spec.volumes.emptyDir.sizeLimit"},
		{"overhead", `{"apiVersion":"v1","kind":"Pod","spec":{"overhead":{"cpu":"5e100"}}}`, false, "spec.overhead.cpu"},
		{"class status", `{"apiVersion":"resclass.io/v1alpha1","kind":"ResourceClass","metadata":{"name":"c"},"status":{"allocatable":"1e-999999999"}}`, true, "status.allocatable"},
		{"look-alikes elsewhere", pod(`"resources":{"limits":{"cpu":"1e2","memory":"8Ei"}}`), false, ""},
		{"class values", `{"apiVersion":"resclass.io/v1alpha1","kind":"ResourceClass","metadata":{"name":"c"},"spec":{"resourceSelector":[{"matchExpressions":[{"key":"memory","operator":"Gt","values":["1e999999999"]}]}]}}`, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gvk, into := podGVK, runtime.Object(&corev1.Pod{})
			if tc.gvk {
				gvk, into = classGVK, &v1alpha1.ResourceClass{}
			}
			var err error
			watchdog.Run(t, func() { err = decode(runtime.RawExtension{Raw: []byte(tc.obj)}, gvk, into) })
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, attrvalue.ErrOutOfRange)):
				t.Fatalf("got %v, want an out-of-range error containing %q", err, tc.want)
			}
		})
	}
}

// The scan that keeps the token walk off the hot path: UIDs, timestamps and
// ordinary quantities pass it; every costly spelling is caught.
func TestMayHoldCostlyQuantity(t *testing.T) {
	for raw, want := range map[string]bool{
		`{"metadata":{"uid":"8a5d2c3e-0000-4000-8000-000000000002","creationTimestamp":"2026-11-24T19:00:00Z"}}`: false,
		`{"limits":{"cpu":"100m","memory":"8Ei","x":"1e18","y":5e10}}`:                                           false,
		`{"limits":{"cpu":"1e-999999999"}}`:                                                                      true,
		`{"limits":{"cpu":1E+100}}`:                                                                              true,
		`{"limits":{"cpu":"-.5e123"}}`:                                                                           true,
		`{"limits":{"cpu":"0.` + strings.Repeat("0", 70) + `1"}}`:                                                true,
		`{"annotations":{"a":"x1e999"}}`:                                                                         false,
	} {
		if got := mayHoldCostlyQuantity([]byte(raw)); got != want {
			t.Errorf("mayHoldCostlyQuantity(%.60s) = %v, want %v", raw, got, want)
		}
	}
}
