package webhook

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/json"
)

// decode reads the object of an admission request into into, which must be
// of gvk. The apiserver sends the object as JSON in the version the webhook
// configuration names, so one case-sensitive parse (as the apiserver's own)
// does it; controller-runtime's generic decoder parses the object twice
// (once to sniff its kind), which was a third of the pod webhook's CPU.
func decode(raw runtime.RawExtension, gvk schema.GroupVersionKind, into runtime.Object) error {
	if len(raw.Raw) == 0 {
		return errors.New("the request carries no object")
	}
	if err := json.UnmarshalCaseSensitivePreserveInts(raw.Raw, into); err != nil {
		return err
	}
	got := into.GetObjectKind().GroupVersionKind()
	if got != gvk {
		return fmt.Errorf("the object is a %q, want a %q", got, gvk)
	}
	return nil
}
