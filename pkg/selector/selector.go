// Package selector compiles a ResourceClass's selectors once and evaluates them
// against devices.
//
// A class selects a device when ANY of its selectors matches, and a selector matches
// when ALL of its expressions do; a class or selector without expressions selects
// nothing. Comparisons are typed by the attribute: a well-known attribute (one a
// device kind declares, pkg/devicekind/kinds) has a fixed type, so a value that
// does not parse as that type is a validation error when the class is created. Any other key is
// compared with the type the device publishes it with; a class value that cannot be
// read as that type makes the expression a non-match, which Explain reports.
//
// Compile does all parsing; Class.Matches does not allocate. See
// docs/resource-classes.md for the unit rules.
package selector

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/attrvalue"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
)

// Keys that address the device itself rather than an attribute.
const (
	KeyKind = "kind"
	KeyID   = "id"
	// keyKindSeed is how the resource-class proposal spells the kind key.
	keyKindSeed = "Kind"
)

type op uint8

const (
	opIn op = iota
	opNotIn
	opEq
	opExists
	opDoesNotExist
	opGt
	opGtEq
	opLt
	opLtEq
)

var operators = map[v1alpha1.ResourceSelectorOperator]op{
	v1alpha1.ResourceSelectorOpIn:           opIn,
	v1alpha1.ResourceSelectorOpNotIn:        opNotIn,
	v1alpha1.ResourceSelectorOpEq:           opEq,
	v1alpha1.ResourceSelectorOpExists:       opExists,
	v1alpha1.ResourceSelectorOpDoesNotExist: opDoesNotExist,
	v1alpha1.ResourceSelectorOpGt:           opGt,
	v1alpha1.ResourceSelectorOpGtEq:         opGtEq,
	v1alpha1.ResourceSelectorOpLt:           opLt,
	v1alpha1.ResourceSelectorOpLtEq:         opLtEq,
}

var supportedOperators = []string{"In", "NotIn", "Eq", "Exists", "DoesNotExist", "Gt", "GtEq", "Lt", "LtEq"}

func (o op) ordering() bool { return o >= opGt }

type target uint8

const (
	targetAttribute target = iota
	targetKind
	targetID
)

// The types a value can be read as, in a fixed order so that readings is an array.
var valueTypes = [...]v1alpha1.AttributeType{
	v1alpha1.AttributeTypeString,
	v1alpha1.AttributeTypeInt,
	v1alpha1.AttributeTypeBool,
	v1alpha1.AttributeTypeQuantity,
	v1alpha1.AttributeTypeBandwidth,
	v1alpha1.AttributeTypeVersion,
}

func slot(t v1alpha1.AttributeType) int {
	switch t {
	case v1alpha1.AttributeTypeString:
		return 0
	case v1alpha1.AttributeTypeInt:
		return 1
	case v1alpha1.AttributeTypeBool:
		return 2
	case v1alpha1.AttributeTypeQuantity:
		return 3
	case v1alpha1.AttributeTypeBandwidth:
		return 4
	case v1alpha1.AttributeTypeVersion:
		return 5
	}
	return -1
}

// value is one selector value, read ahead of time as every type it parses as.
type value struct {
	raw      string
	readings [len(valueTypes)]typed
	valid    [len(valueTypes)]bool
}

func (v *value) as(t v1alpha1.AttributeType) *typed {
	if i := slot(t); i >= 0 && v.valid[i] {
		return &v.readings[i]
	}
	return nil
}

// parseAs reads s as type t.
func parseAs(s string, t v1alpha1.AttributeType) (typed, error) {
	out := typed{typ: t}
	var err error
	switch t {
	case v1alpha1.AttributeTypeString:
		out.s = s
	case v1alpha1.AttributeTypeInt:
		out.i, err = parseInt(s)
	case v1alpha1.AttributeTypeBool:
		out.b, err = parseBool(s)
	case v1alpha1.AttributeTypeQuantity:
		var q resource.Quantity
		q, err = attrvalue.ParseQuantity(s)
		out.q = &q
	case v1alpha1.AttributeTypeBandwidth:
		var q resource.Quantity
		q, err = attrvalue.ParseBandwidth(s)
		out.q = &q
	case v1alpha1.AttributeTypeVersion:
		var v attrvalue.Version
		v, err = attrvalue.ParseVersion(s)
		out.v = &v
	default:
		err = fmt.Errorf("unknown type %q", t)
	}
	return out, err
}

type expression struct {
	key    string
	target target
	op     op
	opName v1alpha1.ResourceSelectorOperator
	values []value
}

// Class is a compiled ResourceClassSpec. It is immutable and safe for concurrent use.
type Class struct {
	selectors [][]expression
	share     *Share // nil: the class takes whole devices
	// createMIG: the class also selects potential MIG slices.
	createMIG bool
}

// Compile validates spec and compiles it. fldPath is the path of spec in its object
// (field.NewPath("spec")), so that errors name the offending field, e.g.
// spec.resourceSelector[0].matchExpressions[1].values[0]. On error the Class is nil.
func Compile(spec *v1alpha1.ResourceClassSpec, fldPath *field.Path) (*Class, field.ErrorList) {
	var errs field.ErrorList
	c := &Class{selectors: make([][]expression, 0, len(spec.ResourceSelector))}
	for i, sel := range spec.ResourceSelector {
		selPath := fldPath.Child("resourceSelector").Index(i)
		exprs := make([]expression, 0, len(sel.MatchExpressions))
		for j := range sel.MatchExpressions {
			e, eErrs := compileExpression(&sel.MatchExpressions[j], selPath.Child("matchExpressions").Index(j))
			errs = append(errs, eErrs...)
			exprs = append(exprs, e)
		}
		// Checks on the device itself are cheapest and rule out most devices, so they
		// go first; the result of an AND does not depend on the order.
		slices.SortStableFunc(exprs, func(a, b expression) int {
			return int(min(b.target, 1)) - int(min(a.target, 1))
		})
		c.selectors = append(c.selectors, exprs)
	}
	share, shareErrs := compileShare(spec.Share, fldPath.Child("share"))
	errs = append(errs, shareErrs...)
	c.share = share
	c.createMIG = spec.CreateMIG
	if spec.CreateMIG && spec.Share != nil {
		errs = append(errs, field.Invalid(fldPath.Child("createMIG"), true, "a share class cannot create MIG slices: a slice is one pod's, whole"))
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return c, nil
}

// Validate reports what is wrong with spec, if anything.
func Validate(spec *v1alpha1.ResourceClassSpec, fldPath *field.Path) field.ErrorList {
	_, errs := Compile(spec, fldPath)
	return errs
}

func compileExpression(r *v1alpha1.ResourceSelectorRequirement, path *field.Path) (expression, field.ErrorList) {
	var errs field.ErrorList
	e := expression{key: r.Key, opName: r.Operator}

	var fixed v1alpha1.AttributeType // "" when the key is not well known
	switch r.Key {
	case "":
		errs = append(errs, field.Required(path.Child("key"), "name the device attribute to compare, e.g. memory, speed or kind"))
	case KeyKind, keyKindSeed:
		e.target, fixed = targetKind, v1alpha1.AttributeTypeString
	case KeyID:
		e.target, fixed = targetID, v1alpha1.AttributeTypeString
	default:
		fixed = kinds.Builtin.AttributeType(r.Key)
	}

	o, ok := operators[r.Operator]
	if !ok {
		return e, append(errs, field.NotSupported(path.Child("operator"), r.Operator, supportedOperators))
	}
	e.op = o

	valuesPath := path.Child("values")
	switch {
	case (o == opIn || o == opNotIn) && len(r.Values) == 0:
		errs = append(errs, field.Required(valuesPath, fmt.Sprintf("%s needs at least one value", r.Operator)))
	case (o == opExists || o == opDoesNotExist) && len(r.Values) > 0:
		errs = append(errs, field.Invalid(valuesPath, r.Values, fmt.Sprintf("%s takes no values", r.Operator)))
	case (o == opEq || o.ordering()) && len(r.Values) != 1:
		errs = append(errs, field.Invalid(valuesPath, r.Values, fmt.Sprintf("%s takes exactly one value", r.Operator)))
	}
	if o.ordering() && fixed != "" && !isOrdered(fixed) {
		errs = append(errs, field.Invalid(path.Child("operator"), r.Operator,
			fmt.Sprintf("%q is a %s and has no order: use In, NotIn or Eq", r.Key, fixed)))
		return e, errs
	}

	e.values = make([]value, len(r.Values))
	for k, raw := range r.Values {
		v := &e.values[k]
		v.raw = raw
		if fixed != "" {
			t, err := parseAs(raw, fixed)
			if err != nil {
				errs = append(errs, field.Invalid(valuesPath.Index(k), raw, fmt.Sprintf("%q is a %s: %v", r.Key, fixed, err)))
				continue
			}
			v.readings[slot(fixed)], v.valid[slot(fixed)] = t, true
			continue
		}
		readable := false
		for i, t := range valueTypes {
			if r, err := parseAs(raw, t); err == nil {
				v.readings[i], v.valid[i] = r, true
				readable = readable || isOrdered(t)
			}
		}
		if o.ordering() && !readable {
			errs = append(errs, field.Invalid(valuesPath.Index(k), raw,
				fmt.Sprintf("%s compares numbers, quantities (30G), bandwidths (40Gbps) or versions (8.0); %q is none of them", r.Operator, raw)))
		}
	}
	return e, errs
}

// outcome is why an expression did or did not match; only for Explain, kept
// allocation-free for Matches.
type outcome uint8

const (
	matched outcome = iota
	notSatisfied
	absent
	present
	badAttribute
	unreadableValue
	unordered
)

// lookup finds what the expression compares: the device's kind or id, or one of
// its attributes.
func (e *expression) lookup(d *Device) (attribute, bool) {
	switch e.target {
	case targetKind:
		return attribute{typed: typed{typ: v1alpha1.AttributeTypeString, s: d.Kind}}, true
	case targetID:
		return attribute{typed: typed{typ: v1alpha1.AttributeTypeString, s: d.ID}}, true
	}
	return d.attr(e.key)
}

func (e *expression) eval(d *Device) outcome {
	a, ok := e.lookup(d)
	switch {
	case !ok && (e.op == opDoesNotExist || e.op == opNotIn):
		return matched
	case !ok:
		return absent
	case e.op == opExists:
		return matched
	case e.op == opDoesNotExist:
		return present
	case a.err != nil:
		return badAttribute
	}
	switch e.op {
	case opIn, opEq, opNotIn:
		found := false
		for i := range e.values {
			if w := e.values[i].as(a.typ); w != nil && equal(&a.typed, w) {
				found = true
				break
			}
		}
		if found == (e.op != opNotIn) {
			return matched
		}
		return notSatisfied
	}
	if !isOrdered(a.typ) {
		return unordered
	}
	w := e.values[0].as(a.typ)
	if w == nil {
		return unreadableValue
	}
	c, _ := compare(&a.typed, w)
	if (e.op == opGt && c > 0) || (e.op == opGtEq && c >= 0) || (e.op == opLt && c < 0) || (e.op == opLtEq && c <= 0) {
		return matched
	}
	return notSatisfied
}

// Matches reports whether the class selects d. Health is not considered: whether an
// unhealthy device may be used is the caller's decision.
func (c *Class) Matches(d *Device) bool {
	if !c.servesClass(d) {
		return false
	}
	for _, exprs := range c.selectors {
		if len(exprs) > 0 && allMatch(exprs, d) {
			return true
		}
	}
	return false
}

func allMatch(exprs []expression, d *Device) bool {
	for i := range exprs {
		if exprs[i].eval(d) != matched {
			return false
		}
	}
	return true
}

// Explain reports whether the class selects d and, if not, why each selector
// rejected it, e.g. `resourceSelector[0]: memory is 16Gi, not GtEq 30G`. It is
// for Events, logs and `node-agent discover`; use Matches on hot paths.
func (c *Class) Explain(d *Device) (bool, []string) {
	if len(c.selectors) == 0 {
		return false, []string{"the class has no selectors, so it selects no device"}
	}
	if !c.servesClass(d) {
		return false, []string{c.whyNotServed(d)}
	}
	var why []string
	for i, exprs := range c.selectors {
		prefix := fmt.Sprintf("resourceSelector[%d]: ", i)
		if len(exprs) == 0 {
			why = append(why, prefix+"no expressions, so it selects no device")
			continue
		}
		reason := ""
		for k := range exprs {
			if o := exprs[k].eval(d); o != matched {
				reason = exprs[k].describe(o, d)
				break
			}
		}
		if reason == "" {
			return true, nil
		}
		why = append(why, prefix+reason)
	}
	return false, why
}

func (e *expression) describe(o outcome, d *Device) string {
	a, _ := e.lookup(d)
	var vals []string
	for _, v := range e.values {
		vals = append(vals, v.raw)
	}
	want := fmt.Sprintf("%s %s", e.opName, strings.Join(vals, ", "))
	switch o {
	case absent:
		return fmt.Sprintf("the device has no %q attribute (%s)", e.key, want)
	case present:
		return fmt.Sprintf("the device has the %q attribute (%s)", e.key, want)
	case badAttribute:
		return fmt.Sprintf("%v (%s)", a.err, want)
	case unordered:
		return fmt.Sprintf("%s is a %s, which has no order (%s)", e.key, a.typ, want)
	case unreadableValue:
		return fmt.Sprintf("%s is a %s, and %q is not (%s)", e.key, a.typ, vals[0], want)
	}
	return fmt.Sprintf("%s is %s, not %s", e.key, a.String(), want)
}
