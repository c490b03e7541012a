// Package dra is resclass on Dynamic Resource Allocation (resource.k8s.io/v1):
// how a ResourceClass's selector becomes a DeviceClass's CEL selector (this
// file) and the controller that keeps those DeviceClasses. How a resclass
// device becomes a DRA device, which the selectors select, is
// pkg/dra/dradevice, kept apart so that the node agent links no CEL.
package dra

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/cel/environment"
	dracel "k8s.io/dynamic-resource-allocation/cel"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/attrvalue"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/dra/dradevice"
	"github.com/resclass/resclass/pkg/selector"
)

// ErrUntranslatable is wrapped by every error of Selector and DeviceClass: the
// class has no DeviceClass, so DRA nodes serve it to nobody.
var ErrUntranslatable = errors.New("has no DRA DeviceClass")

// ManagedByLabel marks the DeviceClasses the controller writes.
const ManagedByLabel = "app.kubernetes.io/managed-by"

// ManagedByValue is ManagedByLabel's value.
const ManagedByValue = "resclass"

// ExtendedResourceName is the extended resource a pod requests to get devices
// of class: the same name on device-plugin nodes and, through the
// DeviceClass's extendedResourceName (DRAExtendedResource, beta and on by
// default in Kubernetes 1.36), on DRA nodes.
func ExtendedResourceName(class string) string { return v1alpha1.ResourceNamePrefix + class }

// Features are the CEL features the selectors are compiled with: those the
// apiserver and kube-scheduler of the pinned release (1.36) enable by default
// (DRAConsumableCapacity is beta and on, DRAListTypeAttributes alpha and
// off). The translation never uses either, so it compiles the same either way.
var Features = dracel.Features{EnableConsumableCapacity: true}

// Bindings of the maps a selector reads; cel.bind evaluates each once and keeps
// the expression short (the apiserver takes at most 10 KiB).
const (
	bindAttrs     = "a"   // device.attributes["resclass.io"]
	bindCapacity  = "c"   // device.capacity["resclass.io"]
	bindBandwidth = "bw"  // device.capacity["bandwidth.resclass.io"]
	bindStandard  = "std" // device.attributes["resource.kubernetes.io"]
)

var bindings = []struct{ name, expr string }{
	{bindAttrs, `device.attributes[` + quote(dradevice.DriverName) + `]`},
	{bindCapacity, `device.capacity[` + quote(dradevice.DriverName) + `]`},
	{bindBandwidth, `device.capacity[` + quote(dradevice.BandwidthDomain) + `]`},
	{bindStandard, `device.attributes[` + quote(dradevice.StandardDomain) + `]`},
}

func binding(domain string, capacity bool) string {
	switch {
	case capacity && domain == dradevice.BandwidthDomain:
		return bindBandwidth
	case capacity:
		return bindCapacity
	case domain == dradevice.StandardDomain:
		return bindStandard
	}
	return bindAttrs
}

// Selector translates a ResourceClass's selectors into one CEL device
// selector that selects, among the devices Device maps, exactly those the class
// selects (selector.Class.Matches): OR of the selectors, AND of their
// expressions, typed as the selector types them. It refuses a class the
// selector refuses, and one whose expression the apiserver would refuse
// (longer than 10 KiB, or above its cost limit by the upstream estimate);
// docs/dra.md ("Classes") has the table.
func Selector(spec *v1alpha1.ResourceClassSpec) (string, error) {
	class, errs := selector.Compile(spec, field.NewPath("spec"))
	if len(errs) > 0 {
		return "", fmt.Errorf("the class %w: %w", ErrUntranslatable, errs.ToAggregate())
	}
	t := translator{used: map[string]bool{}}
	var ors []string
	for _, sel := range spec.ResourceSelector {
		if len(sel.MatchExpressions) == 0 {
			continue // selects nothing: false in an OR
		}
		var ands []string
		for i := range sel.MatchExpressions {
			e, err := t.requirement(&sel.MatchExpressions[i])
			if err != nil {
				return "", fmt.Errorf("the class %w: %w", ErrUntranslatable, err)
			}
			ands = append(ands, e)
		}
		ors = append(ors, join(ands, " && "))
	}
	body := "false"
	if len(ors) > 0 {
		body = join(ors, " || ")
	}
	for i := len(bindings) - 1; i >= 0; i-- {
		if b := bindings[i]; t.used[b.name] {
			body = "cel.bind(" + b.name + ", " + b.expr + ", " + body + ")"
		}
	}
	expr := "device.driver == " + quote(dradevice.DriverName) + " && " + body
	if body != "false" {
		expr = "device.driver == " + quote(dradevice.DriverName) + " && " + servedAs(spec, class) + " && " + body
	}
	if err := Check(expr); err != nil {
		return "", fmt.Errorf("the class %w: %w", ErrUntranslatable, err)
	}
	return expr, nil
}

// servedAs is the CEL of pkg/selector's rule of who a device serves: a class
// without a share selects only devices served whole (no sharing mode
// published), and potential MIG slices only if it has createMIG (a share
// class never has it); a class with a share only devices that serve shares and whose
// share capacities each hold one unit of what the share takes (a capacity
// the device does not publish holds none). The device publishes whole
// bytes and percent (dradevice), as the selector counts them.
func servedAs(spec *v1alpha1.ResourceClassSpec, class *selector.Class) string {
	mode := quote(dradevice.AttributeShareMode) + " in device.attributes[" + quote(dradevice.ShareDomain) + "]"
	unit, ok := class.Share()
	if !ok {
		if class.CreatesMIG() || !mayBeMIG(spec) {
			return "!(" + mode + ")"
		}
		potential := quote(dradevice.AttributePotential) + " in device.attributes[" + quote(dradevice.MIGDomain) + "]"
		return "!(" + mode + ") && !(" + potential + ")"
	}
	parts := []string{mode}
	capacity := "device.capacity[" + quote(dradevice.ShareDomain) + "]"
	for _, c := range []struct {
		name string
		unit int64
	}{{v1alpha1.CapacityMemory, unit.Memory}, {v1alpha1.CapacityCompute, unit.Compute}} {
		if c.unit > 0 {
			parts = append(parts, "("+quote(c.name)+" in "+capacity+" && "+capacity+"["+quote(c.name)+"].compareTo(quantity("+quote(strconv.FormatInt(c.unit, 10))+")) >= 0)")
		}
	}
	return strings.Join(parts, " && ")
}

// mayBeMIG says whether a selector of spec could select a device of kind
// nvidia-mig, a potential slice's: not when each one that selects anything
// asks for kinds that do not include it (In or Eq on the kind). Only then
// does a class without createMIG need the test that excludes potential
// slices, which costs each evaluation a fifth more
// (BenchmarkDeviceClassMatch): the GPU classes go without it.
func mayBeMIG(spec *v1alpha1.ResourceClassSpec) bool {
	for _, sel := range spec.ResourceSelector {
		if len(sel.MatchExpressions) == 0 {
			continue // selects nothing
		}
		excluded := false
		for _, e := range sel.MatchExpressions {
			// Keys are read case-insensitively; a value that differs in
			// case only is taken to name the kind too.
			if strings.EqualFold(e.Key, selector.KeyKind) && (e.Operator == v1alpha1.ResourceSelectorOpIn || e.Operator == v1alpha1.ResourceSelectorOpEq) &&
				!slices.ContainsFunc(e.Values, func(v string) bool { return strings.EqualFold(v, v1alpha1.DeviceKindNvidiaMIG) }) {
				excluded = true
				break
			}
		}
		if !excluded {
			return true
		}
	}
	return false
}

// Check compiles expr as the apiserver does when a DeviceClass is written
// (resource.k8s.io validation at the pinned release) and refuses it as the
// apiserver would: too long, not compiling, or above the cost limit.
func Check(expr string) error {
	if len(expr) > resourceapi.CELSelectorExpressionMaxLength {
		return fmt.Errorf("its CEL selector would be %d bytes; the apiserver takes at most %d (fewer values or selectors)",
			len(expr), resourceapi.CELSelectorExpressionMaxLength)
	}
	envType := environment.NewExpressions // what the apiserver checks a new or changed expression with
	r := dracel.GetCompiler(Features).CompileCELExpression(expr, dracel.Options{EnvType: &envType})
	if r.Error != nil {
		return fmt.Errorf("its CEL selector does not compile: %w", r.Error)
	}
	if r.MaxCost > resourceapi.CELSelectorExpressionMaxCost {
		return fmt.Errorf("its CEL selector's estimated cost %d is above the apiserver's limit %d (fewer values or selectors)",
			r.MaxCost, resourceapi.CELSelectorExpressionMaxCost)
	}
	return nil
}

func join(parts []string, sep string) string {
	if len(parts) == 1 {
		return parts[0]
	}
	return "(" + strings.Join(parts, sep) + ")"
}

type translator struct {
	used map[string]bool
}

func (t *translator) bind(name string) string {
	t.used[name] = true
	return name
}

// at is the CEL of the value of attribute or capacity key in binding m, and
// has the CEL that is true when the device has it.
func (t *translator) at(m, key string) (at, has string) {
	m = t.bind(m)
	return m + "[" + quote(key) + "]", quote(key) + " in " + m
}

// representable reports whether a device Device maps can have attribute key:
// Device refuses devices whose attribute names DRA cannot carry, so on a
// mapped device such a key is absent.
func representable(key string) bool {
	return len(key) <= resourceapi.DeviceMaxIDLength && len(validation.IsCIdentifier(key)) == 0 &&
		key != dradevice.AttributeKind && key != dradevice.AttributeID
}

func (t *translator) requirement(r *v1alpha1.ResourceSelectorRequirement) (string, error) {
	for _, v := range r.Values {
		if !utf8.ValidString(v) {
			return "", fmt.Errorf("key %q: value %q is not UTF-8, which CEL strings are", r.Key, v)
		}
	}
	switch r.Key {
	case selector.KeyKind, "Kind":
		return t.fixed(r, dradevice.AttributeKind, bindAttrs, v1alpha1.AttributeTypeString, "true")
	case selector.KeyID:
		return t.fixed(r, dradevice.AttributeID, bindAttrs, v1alpha1.AttributeTypeString, "true")
	}
	if !representable(r.Key) {
		// No mapped device has the attribute.
		switch r.Operator {
		case v1alpha1.ResourceSelectorOpNotIn, v1alpha1.ResourceSelectorOpDoesNotExist:
			return "true", nil
		}
		return "false", nil
	}
	if typ := kinds.Builtin.AttributeType(r.Key); typ != "" {
		domain, _, capacity := dradevice.Where(r.Key, typ)
		_, has := t.at(binding(domain, capacity), r.Key)
		return t.fixed(r, r.Key, binding(domain, capacity), typ, has)
	}
	return t.undeclared(r)
}

// fixed translates a requirement on a key whose type is known, found in
// binding m; has is the CEL that is true when the device has it.
func (t *translator) fixed(r *v1alpha1.ResourceSelectorRequirement, key, m string, typ v1alpha1.AttributeType, has string) (string, error) {
	val, _ := t.at(m, key)
	switch r.Operator {
	case v1alpha1.ResourceSelectorOpExists:
		return has, nil
	case v1alpha1.ResourceSelectorOpDoesNotExist:
		return negate(has), nil
	}
	var cmp string
	switch r.Operator {
	case v1alpha1.ResourceSelectorOpIn, v1alpha1.ResourceSelectorOpEq, v1alpha1.ResourceSelectorOpNotIn:
		var readings []reading
		for _, v := range r.Values {
			if rd, ok := read(v, typ); ok {
				readings = append(readings, rd)
			}
		}
		cmp = equalAny(val, typ, readings)
	default:
		rd, ok := read(r.Values[0], typ)
		if !ok {
			cmp = "false"
		} else {
			cmp = order(val, typ, rd, r.Operator)
		}
	}
	e := and(has, cmp)
	if r.Operator == v1alpha1.ResourceSelectorOpNotIn {
		return negate(e), nil
	}
	return e, nil
}

// undeclared translates a requirement on a key no kind declares: the device
// publishes it with any type, so each type's place is tested and each value
// compared as it reads in that type, as the selector does.
func (t *translator) undeclared(r *v1alpha1.ResourceSelectorRequirement) (string, error) {
	attr, hasAttr := t.at(bindAttrs, r.Key)
	qty, hasQty := t.at(bindCapacity, r.Key)
	bw, hasBw := t.at(bindBandwidth, r.Key)
	has := "(" + hasAttr + " || " + hasQty + " || " + hasBw + ")"
	switch r.Operator {
	case v1alpha1.ResourceSelectorOpExists:
		return has, nil
	case v1alpha1.ResourceSelectorOpDoesNotExist:
		return negate(has), nil
	}
	// An attribute holds a string, an int, a bool or a version: type() tells
	// the first three apart, and what is none of them is a version (Device
	// publishes no lists).
	guards := map[v1alpha1.AttributeType]string{
		v1alpha1.AttributeTypeString:  "type(" + attr + ") in [string]",
		v1alpha1.AttributeTypeInt:     "type(" + attr + ") in [int]",
		v1alpha1.AttributeTypeBool:    "type(" + attr + ") in [bool]",
		v1alpha1.AttributeTypeVersion: "!(type(" + attr + ") in [string] || type(" + attr + ") in [int] || type(" + attr + ") in [bool])",
	}
	attrTypes := []v1alpha1.AttributeType{v1alpha1.AttributeTypeString, v1alpha1.AttributeTypeInt, v1alpha1.AttributeTypeBool, v1alpha1.AttributeTypeVersion}
	var attrAlts, qtyAlts, bwAlts []string
	switch r.Operator {
	case v1alpha1.ResourceSelectorOpIn, v1alpha1.ResourceSelectorOpEq, v1alpha1.ResourceSelectorOpNotIn:
		byType := map[v1alpha1.AttributeType][]reading{}
		for _, v := range r.Values {
			for _, typ := range allTypes {
				if rd, ok := read(v, typ); ok {
					byType[typ] = append(byType[typ], rd)
				}
			}
		}
		for _, typ := range attrTypes {
			if len(byType[typ]) > 0 {
				attrAlts = append(attrAlts, and(guards[typ], equalAny(attr, typ, byType[typ])))
			}
		}
		if rs := byType[v1alpha1.AttributeTypeQuantity]; len(rs) > 0 {
			qtyAlts = append(qtyAlts, equalAny(qty, v1alpha1.AttributeTypeQuantity, rs))
		}
		if rs := byType[v1alpha1.AttributeTypeBandwidth]; len(rs) > 0 {
			bwAlts = append(bwAlts, equalAny(bw, v1alpha1.AttributeTypeBandwidth, rs))
		}
	default:
		v := r.Values[0]
		for _, typ := range []v1alpha1.AttributeType{v1alpha1.AttributeTypeInt, v1alpha1.AttributeTypeVersion} {
			if rd, ok := read(v, typ); ok {
				attrAlts = append(attrAlts, and(guards[typ], order(attr, typ, rd, r.Operator)))
			}
		}
		if rd, ok := read(v, v1alpha1.AttributeTypeQuantity); ok {
			qtyAlts = append(qtyAlts, order(qty, v1alpha1.AttributeTypeQuantity, rd, r.Operator))
		}
		if rd, ok := read(v, v1alpha1.AttributeTypeBandwidth); ok {
			bwAlts = append(bwAlts, order(bw, v1alpha1.AttributeTypeBandwidth, rd, r.Operator))
		}
	}
	var alts []string
	if len(attrAlts) > 0 {
		alts = append(alts, and(hasAttr, join(attrAlts, " || ")))
	}
	if len(qtyAlts) > 0 {
		alts = append(alts, and(hasQty, qtyAlts[0]))
	}
	if len(bwAlts) > 0 {
		alts = append(alts, and(hasBw, bwAlts[0]))
	}
	e := "false"
	if len(alts) > 0 {
		e = join(alts, " || ")
	}
	if r.Operator == v1alpha1.ResourceSelectorOpNotIn {
		return negate(e), nil
	}
	return e, nil
}

func and(a, b string) string {
	switch {
	case a == "true":
		return b
	case b == "false" || a == "false":
		return "false"
	case b == "true":
		return a
	}
	return "(" + a + " && " + b + ")"
}

func negate(e string) string {
	switch e {
	case "true":
		return "false"
	case "false":
		return "true"
	}
	return "!" + paren(e)
}

func paren(e string) string {
	if strings.HasPrefix(e, "(") && strings.HasSuffix(e, ")") && balanced(e[1:len(e)-1]) {
		return e
	}
	return "(" + e + ")"
}

// balanced reports whether e's parentheses (outside string literals) never
// close one they did not open, so that "(" + e + ")" is one group.
func balanced(e string) bool {
	depth, inString, escaped := 0, false, false
	for i := 0; i < len(e); i++ {
		c := e[i]
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case !inString && c == '(':
			depth++
		case !inString && c == ')':
			depth--
			if depth < 0 {
				return false
			}
		}
	}
	return depth == 0
}

var allTypes = []v1alpha1.AttributeType{
	v1alpha1.AttributeTypeString, v1alpha1.AttributeTypeInt, v1alpha1.AttributeTypeBool,
	v1alpha1.AttributeTypeQuantity, v1alpha1.AttributeTypeBandwidth, v1alpha1.AttributeTypeVersion,
}

// reading is a class value read as one type, written as a CEL literal.
// exact is false for a version with a non-zero part after the third, which
// no mapped device equals; its literal is then its first three parts
// (see order).
type reading struct {
	literal string
	exact   bool
}

// read reads a class value as typ exactly as pkg/selector does (its parseAs),
// and writes it as a CEL literal.
func read(s string, typ v1alpha1.AttributeType) (reading, bool) {
	switch typ {
	case v1alpha1.AttributeTypeString:
		return reading{quote(s), true}, true
	case v1alpha1.AttributeTypeInt:
		i, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return reading{}, false
		}
		if i == math.MinInt64 {
			// CEL reads -9223372036854775808 as the negation of a literal
			// one beyond the largest int.
			return reading{"(-9223372036854775807 - 1)", true}, true
		}
		return reading{strconv.FormatInt(i, 10), true}, true
	case v1alpha1.AttributeTypeBool:
		switch {
		case strings.EqualFold(s, "true"):
			return reading{"true", true}, true
		case strings.EqualFold(s, "false"):
			return reading{"false", true}, true
		}
		return reading{}, false
	case v1alpha1.AttributeTypeQuantity:
		q, err := attrvalue.ParseQuantity(s)
		if err != nil {
			return reading{}, false
		}
		return reading{"quantity(" + quote(exactQuantity(q)) + ")", true}, true
	case v1alpha1.AttributeTypeBandwidth:
		q, err := attrvalue.ParseBandwidth(s)
		if err != nil {
			return reading{}, false
		}
		return reading{"quantity(" + quote(exactQuantity(q)) + ")", true}, true
	case v1alpha1.AttributeTypeVersion:
		v, err := attrvalue.ParseVersion(s)
		if err != nil {
			return reading{}, false
		}
		if sv, ok := dradevice.Semver(v); ok {
			return reading{"semver(" + quote(sv) + ")", true}, true
		}
		parts := strings.SplitN(v.String(), ".", 4)
		return reading{"semver(" + quote(strings.Join(parts[:3], ".")) + ")", false}, true
	}
	return reading{}, false
}

// exactQuantity writes q so that parsing it gives q's value exactly (see
// exact).
func exactQuantity(q resource.Quantity) string {
	e := dradevice.Exact(q)
	return e.String()
}

// equalAny is the CEL that is true when val (of type typ) equals one of
// readings.
func equalAny(val string, typ v1alpha1.AttributeType, readings []reading) string {
	var lits []string
	for _, r := range readings {
		if r.exact {
			lits = append(lits, r.literal)
		}
	}
	switch {
	case len(lits) == 0:
		return "false"
	case typ == v1alpha1.AttributeTypeQuantity || typ == v1alpha1.AttributeTypeBandwidth:
		// Quantities are compared by value (1Gi and 1073741824 are equal).
		var alts []string
		for _, l := range lits {
			alts = append(alts, val+".compareTo("+l+") == 0")
		}
		return join(alts, " || ")
	case len(lits) == 1:
		return val + " == " + lits[0]
	}
	return val + " in [" + strings.Join(lits, ", ") + "]"
}

// order is the CEL of val op r for an ordered type.
func order(val string, typ v1alpha1.AttributeType, r reading, op v1alpha1.ResourceSelectorOperator) string {
	sym := map[v1alpha1.ResourceSelectorOperator]string{
		v1alpha1.ResourceSelectorOpGt: ">", v1alpha1.ResourceSelectorOpGtEq: ">=",
		v1alpha1.ResourceSelectorOpLt: "<", v1alpha1.ResourceSelectorOpLtEq: "<=",
	}[op]
	if !r.exact {
		// r is w cut to three parts, w having more. A mapped version v has at
		// most three: v > w and v >= w when v > w3; v < w and v <= w when
		// v <= w3.
		switch op {
		case v1alpha1.ResourceSelectorOpGt, v1alpha1.ResourceSelectorOpGtEq:
			sym = ">"
		default:
			sym = "<="
		}
	}
	if typ == v1alpha1.AttributeTypeInt {
		return val + " " + sym + " " + r.literal
	}
	return val + ".compareTo(" + r.literal + ") " + sym + " 0"
}

// quote writes s as a CEL string literal, escaping quotes, backslashes and
// everything that is not a printable character.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x80 && unicode.IsPrint(r):
			b.WriteRune(r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// DeviceClass is the DeviceClass of rc: the same name, its selector
// translated (Selector), extendedResourceName class.resclass.io/<name> unless
// rc is a share class, and rc
// as its controlling owner, so that deleting rc deletes it.
func DeviceClass(rc *v1alpha1.ResourceClass) (*resourceapi.DeviceClass, error) {
	expr, err := Selector(&rc.Spec)
	if err != nil {
		return nil, err
	}
	// A share class has no extended resource on DRA nodes: the
	// extended-resource form consumes a device's requestPolicy defaults,
	// which are the device's, not the class's unit, and classes of different
	// units select the same devices. Its pods use a ResourceClaim that
	// requests N units as capacity (docs/dra.md, "Share classes").
	var extended *string
	if rc.Spec.Share == nil {
		extended = ptrTo(ExtendedResourceName(rc.Name))
	}
	return &resourceapi.DeviceClass{
		TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{
			Name:   rc.Name,
			Labels: map[string]string{ManagedByLabel: ManagedByValue},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1alpha1.SchemeGroupVersion.String(),
				Kind:       "ResourceClass",
				Name:       rc.Name,
				UID:        rc.UID,
				Controller: ptrTo(true),
			}},
		},
		Spec: resourceapi.DeviceClassSpec{
			Selectors:            []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}},
			ExtendedResourceName: extended,
		},
	}, nil
}

func ptrTo[T any](v T) *T { return &v }
