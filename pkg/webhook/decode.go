package webhook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	sigsjson "sigs.k8s.io/json"

	"github.com/resclass/resclass/pkg/attrvalue"
)

// decode reads the object of an admission request into into, which must be
// of gvk. The apiserver sends the object as JSON in the version the webhook
// configuration names, so one case-sensitive parse (as the apiserver's own)
// does it; controller-runtime's generic decoder parses the object twice
// (once to sniff its kind), which was a third of the pod webhook's CPU.
//
// Quantities are checked first (checkQuantities): decoding one with
// apimachinery costs 10^|exponent|, so a pod asking for "1e-999999999" CPUs
// would hold a webhook goroutine, and a core, forever.
func decode(raw runtime.RawExtension, gvk schema.GroupVersionKind, into kinded) error {
	if len(raw.Raw) == 0 {
		return errors.New("the request carries no object")
	}
	if mayHoldCostlyQuantity(raw.Raw) {
		if err := checkQuantities(raw.Raw); err != nil {
			return err
		}
	}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw.Raw, into); err != nil {
		return err
	}
	got := into.GetObjectKind().GroupVersionKind()
	if got != gvk {
		return fmt.Errorf("the object is a %q, want a %q", got, gvk)
	}
	return nil
}

// kinded is what decode decodes into: an API object, or a struct that embeds
// metav1.TypeMeta and holds only the fields a policy reads (policyPod).
type kinded interface {
	GetObjectKind() schema.ObjectKind
}

// Bounds on the quantities of admitted objects, looser than the device
// attributes' (pkg/selector): they only keep decoding cheap, so that nothing
// the apiserver would store is refused for its spelling.
const (
	maxQuantityText     = 128
	maxQuantityExponent = 99
)

// mayHoldCostlyQuantity is a scan of the raw bytes, microseconds for a pod,
// that rules out costly quantities in nearly every object: they need an
// exponent of three digits or more on a number that is a whole JSON value, or
// a long run of digits. (A UID such as "…2c3e-0000-4000…" has the first shape
// inside a string, not as one.) Only an object it cannot rule out is walked
// token by token.
func mayHoldCostlyQuantity(raw []byte) bool {
	run := 0
	for i, c := range raw {
		if isDigit(c) || c == '.' {
			if run++; run > maxQuantityText/2 {
				return true
			}
			continue
		}
		run = 0
		if (c != 'e' && c != 'E') || i == 0 || !isDigit(raw[i-1]) && raw[i-1] != '.' {
			continue
		}
		j := i + 1
		if j < len(raw) && (raw[j] == '+' || raw[j] == '-') {
			j++
		}
		k := j
		for k < len(raw) && isDigit(raw[k]) {
			k++
		}
		if k-j < 3 || k < len(raw) && !isBoundary(raw[k]) {
			continue
		}
		b := i - 1
		for b > 0 && (isDigit(raw[b-1]) || raw[b-1] == '.') {
			b--
		}
		if b > 0 && (raw[b-1] == '+' || raw[b-1] == '-') {
			b--
		}
		if b == 0 || isBoundary(raw[b-1]) {
			return true
		}
	}
	return false
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// isBoundary reports whether c may stand next to a JSON value: a string's
// quotes, a number's neighbours.
func isBoundary(c byte) bool {
	switch c {
	case '"', ':', ',', '[', ']', '{', '}', ' ', '\t', '\r', '\n':
		return true
	}
	return false
}

// quantityMaps are the keys of maps whose values are quantities in the
// objects this webhook decodes (a container's or a pod's resources, a pod's
// overhead, a container status's allocated resources); quantityFields are the
// quantities held by a field of an object, by the field's name within it.
var (
	quantityMaps   = map[string]bool{"limits": true, "requests": true, "overhead": true, "allocatedResources": true}
	quantityFields = map[[2]string]bool{{"emptyDir", "sizeLimit"}: true, {"status", "allocatable"}: true, {"status", "requested"}: true}
)

// checkQuantities walks the object and refuses a quantity whose text is
// longer than maxQuantityText or whose exponent is beyond maxQuantityExponent,
// naming its path. Only values where the object's types hold quantities are
// checked: an annotation or an environment variable may say "1e999".
func checkQuantities(raw []byte) error {
	type frame struct {
		name   string // the key this object or array is under in its parent
		object bool
		key    string // the current key, in an object
		atKey  bool   // the next string is a key
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	stack := []frame{{}}
	var path []string
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return nil // not JSON: the decoder says so
		}
		top := &stack[len(stack)-1]
		if top.object && top.atKey {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack, path = stack[:len(stack)-1], path[:max(0, len(path)-1)]
				continue
			}
			top.key, top.atKey = fmt.Sprint(tok), false
			continue
		}
		var text string
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				name, elem := top.key, ""
				if !top.object {
					name = top.name // an array's elements are under its name
				} else {
					elem = name
				}
				top.atKey = top.object
				stack = append(stack, frame{name: name, object: t == '{', atKey: t == '{'})
				path = append(path, elem)
			case '}', ']':
				stack, path = stack[:len(stack)-1], path[:max(0, len(path)-1)]
				if len(stack) == 0 {
					return nil
				}
				top := &stack[len(stack)-1]
				top.atKey = top.object
			}
			continue
		case string:
			text = t
		case json.Number:
			text = t.String()
		default:
			top.atKey = top.object
			continue
		}
		top.atKey = top.object
		if !top.object || !quantityMaps[top.name] && !quantityFields[[2]string{top.name, top.key}] {
			continue
		}
		where := fmt.Sprintf("%s.%s", joinPath(path), top.key)
		if len(text) > maxQuantityText {
			return fmt.Errorf("%s: a quantity of %d characters is %w (at most %d)", where, len(text), attrvalue.ErrOutOfRange, maxQuantityText)
		}
		if err := attrvalue.CheckExponent(text, maxQuantityExponent); err != nil {
			return fmt.Errorf("%s: %q: %w", where, text, err)
		}
	}
}

func joinPath(path []string) string {
	var b bytes.Buffer
	for _, p := range path {
		if p == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(p)
	}
	return b.String()
}
