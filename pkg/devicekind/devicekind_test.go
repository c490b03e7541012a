package devicekind

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/resclass/resclass/pkg/internal/watchdog"
)

func FuzzLabelValue(f *testing.F) {
	for _, s := range []string{"NVIDIA A100-SXM4-80GB", " Tesla T4 ", "-x-", "Ünïcode GPU", "a/b:c", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		watchdog.Run(t, func() {
			v := LabelValue(s)
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				t.Fatalf("LabelValue(%q) = %q: %v", s, v, errs)
			}
		})
	})
}
