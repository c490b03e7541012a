// Package assignment is the one place that reads and writes the hand-off from the
// resclass scheduler to the resclass node agent: which devices of which class each
// container of a pod gets.
//
// The scheduler picks the exact device ids in Reserve and writes them onto the pod
// with the pod's Binding (or, when configured, with a PreBind patch before binding
// it; docs/scheduler.md). When the kubelet later calls Allocate on the node agent, the
// agent reads them back and hands each container exactly the devices the scheduler
// accounted for. Writer and reader must agree on every detail of the format, hence
// one package used by both.
//
// The annotation resclass.io/assignment (AnnotationKey) is the single source of
// truth. Its value is JSON:
//
//	{"node":"gpu-node-7","containers":[
//	  {"name":"setup","init":true,"classes":{"fast.nic":["0000:3b:00.0"]}},
//	  {"name":"train","classes":{"nvidia.high.mem":["GPU-4b8a…","GPU-9c1d…"]}}]}
//
// A MIG slice to create is named by mig.SliceID ("GPU-4b8a…/mig/2g.20gb@4": the
// parent GPU, the profile and the start) and makes the assignment version 2
// ("version":2), which an agent that predates slices refuses.
//
// Decode is strict: a pod carrying an assignment that is not exactly right must fail
// loudly in Allocate rather than run on devices nobody accounted for. Encode
// validates with the same rules, so the scheduler can never write what the agent
// would refuse, and is deterministic (containers and ids in the order given, class
// names sorted), so an unchanged assignment yields an unchanged annotation.
//
// For tools built on the original Kubernetes resource-class proposal, Annotations
// also writes one scheduler.alpha.kubernetes.io/resClass_<class>_<device> key per
// device (see CompatKey). Those keys are write-only: they are lossy (ids that are
// not valid in an annotation key, or too long for one, are sanitized and shortened
// with a hash), so nothing in resclass ever reads them back.
package assignment

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	sigsjson "sigs.k8s.io/json"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/mig"
)

const (
	// AnnotationKey holds the JSON-encoded Assignment of a pod.
	AnnotationKey = "resclass.io/assignment"

	// MaxEncodedSize bounds the encoded assignment. Pod annotations share 256 KiB in
	// all; an assignment of any real pod is a few hundred bytes, so this only keeps a
	// corrupt or hostile value from costing the agent much.
	MaxEncodedSize = 64 << 10

	// MaxDeviceIDLength is the longest device id, in characters, as NodeDevices
	// allows it.
	MaxDeviceIDLength = 128

	// maxClassNameLength: a class name is also the name part of the extended
	// resource class.resclass.io/<name>, which allows 63 characters.
	maxClassNameLength = 63
)

// Assignment is the devices the scheduler gave a pod on one node.
type Assignment struct {
	// Version is 2 when a container is given a MIG slice to create (its id
	// is mig.SliceID's, docs/mig.md); absent otherwise (version 1, which
	// every agent reads). Encode sets it; an agent that predates slices
	// refuses a version 2 assignment (an unknown field) rather than hand
	// out a device that does not exist.
	Version int `json:"version,omitempty"`
	// Node is the node the devices are on, so an agent can tell an assignment
	// meant for another node.
	Node string `json:"node"`
	// Containers lists each container that gets devices, init containers included.
	Containers []Container `json:"containers"`
}

// Container is the devices of one container, by class name.
type Container struct {
	Name string `json:"name"`
	// Init marks an init container. Kubernetes gives init and regular containers
	// one namespace of names, so it only informs, it does not disambiguate.
	Init bool `json:"init,omitempty"`
	// Classes maps a class name (without the class.resclass.io/ prefix) to device
	// ids.
	Classes map[string][]string `json:"classes"`
	// Shares maps each share class of the container (docs/sharing.md) to what
	// it takes of that class's one device, by capacity name: memory in
	// bytes, compute in percent. The amounts are written here, not derived
	// from the class, so that a class deleted and made again with another
	// unit does not change what running pods hold.
	Shares map[string]Share `json:"shares,omitempty"`
}

// Version2 is the version of an assignment that gives MIG slices to create.
const Version2 = 2

// HasSlices says whether a gives a container a MIG slice to create.
func (a *Assignment) HasSlices() bool {
	for _, c := range a.Containers {
		for _, ids := range c.Classes {
			for _, id := range ids {
				if _, _, _, ok := mig.ParseSliceID(id); ok {
					return true
				}
			}
		}
	}
	return false
}

// Share is what a container's share takes of a device, by capacity name
// (v1alpha1.CapacityMemory in bytes, v1alpha1.CapacityCompute in percent).
type Share map[string]int64

// Encode validates a and returns its annotation value.
func Encode(a *Assignment) (string, error) {
	if a != nil {
		v := *a
		v.Version = 0
		if v.HasSlices() {
			v.Version = Version2
		}
		a = &v
	}
	if err := Validate(a); err != nil {
		return "", fmt.Errorf("invalid assignment: %w", err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// Unescaped <, > and & keep the value readable and never longer than what Decode
	// accepted, so anything Decode returns can be encoded again.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(a); err != nil {
		return "", fmt.Errorf("encoding assignment: %w", err)
	}
	s := string(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
	if len(s) > MaxEncodedSize {
		return "", fmt.Errorf("assignment encodes to %d bytes, more than the %d allowed", len(s), MaxEncodedSize)
	}
	return s, nil
}

// Decode parses and validates an annotation value.
func Decode(s string) (*Assignment, error) {
	if len(s) > MaxEncodedSize {
		return nil, fmt.Errorf("assignment is %d bytes, more than the %d allowed", len(s), MaxEncodedSize)
	}
	// JSON decoding would turn each invalid byte into a 3-byte U+FFFD.
	if !utf8.ValidString(s) {
		return nil, errors.New("malformed assignment: not valid UTF-8")
	}
	var a Assignment
	// Unlike encoding/json, this matches field names case-sensitively and reports
	// duplicate keys, which would otherwise silently drop devices.
	strict, err := sigsjson.UnmarshalStrict([]byte(s), &a)
	if err != nil {
		return nil, fmt.Errorf("malformed assignment: %w", err)
	}
	if len(strict) > 0 {
		return nil, fmt.Errorf("malformed assignment: %w", utilerrors.NewAggregate(strict))
	}
	if err := Validate(&a); err != nil {
		return nil, fmt.Errorf("invalid assignment: %w", err)
	}
	// "shares":{} says what no shares says, and Encode writes it so.
	for i := range a.Containers {
		if len(a.Containers[i].Shares) == 0 {
			a.Containers[i].Shares = nil
		}
	}
	return &a, nil
}

// Validate checks a against the rules Encode and Decode enforce. Every problem is
// reported, each with the path of the offending field, e.g.
// containers[1].classes["fast.nic"][0].
func Validate(a *Assignment) error {
	if a == nil {
		return errors.New("assignment is nil")
	}
	errs := checkName(field.NewPath("node"), a.Node, validation.DNS1123SubdomainMaxLength, validation.IsDNS1123Subdomain)
	switch {
	case a.Version != 0 && a.Version != Version2:
		errs = append(errs, field.NotSupported(field.NewPath("version"), a.Version, []string{"2"}))
	case a.Version == Version2 && !a.HasSlices():
		errs = append(errs, field.Invalid(field.NewPath("version"), a.Version, "version 2 is for assignments that give MIG slices to create; this one gives none"))
	case a.Version == 0 && a.HasSlices():
		errs = append(errs, field.Invalid(field.NewPath("version"), a.Version, "an assignment that gives MIG slices to create is version 2"))
	}

	containers := field.NewPath("containers")
	if len(a.Containers) == 0 {
		errs = append(errs, field.Required(containers, "an assignment gives devices to at least one container"))
	}
	names := map[string]bool{}
	for i, c := range a.Containers {
		p := containers.Index(i)
		// A device is given once per container. Across containers it may
		// repeat, as the kubelet shares it: an init container's devices are
		// reused by the containers after it, and a hugepage pool serves many.
		assigned := map[string]*field.Path{} // device id -> where it was first given
		if nameErrs := checkName(p.Child("name"), c.Name, validation.DNS1123LabelMaxLength, validation.IsDNS1123Label); len(nameErrs) > 0 {
			errs = append(errs, nameErrs...)
		} else if names[c.Name] {
			errs = append(errs, field.Duplicate(p.Child("name"), c.Name))
		}
		names[c.Name] = true

		classes := p.Child("classes")
		if len(c.Classes) == 0 {
			errs = append(errs, field.Required(classes, "a listed container gets devices of at least one class"))
		}
		// Sorted so errors, and which of two duplicates is blamed, are stable.
		for _, class := range slices.Sorted(maps.Keys(c.Classes)) {
			if classErrs := checkName(classes, class, maxClassNameLength, validation.IsDNS1123Subdomain); len(classErrs) > 0 {
				// Its devices are not checked: the path would repeat a bad, maybe huge, key.
				errs = append(errs, classErrs...)
				continue
			}
			ids := c.Classes[class]
			cp := classes.Key(strconv.Quote(class))
			if len(ids) == 0 {
				errs = append(errs, field.Required(cp, "empty device list"))
			}
			for j, id := range ids {
				dp := cp.Index(j)
				switch {
				case id == "":
					errs = append(errs, field.Required(dp, "empty device id"))
				case utf8.RuneCountInString(id) > MaxDeviceIDLength:
					errs = append(errs, field.TooLong(dp, id, MaxDeviceIDLength))
				case !printable(id):
					errs = append(errs, field.Invalid(dp, id, "device id must be UTF-8 of printable characters"))
				case assigned[id] != nil:
					errs = append(errs, &field.Error{Type: field.ErrorTypeDuplicate, Field: dp.String(), BadValue: id,
						Detail: "device already given at " + assigned[id].String()})
				default:
					assigned[id] = dp
				}
			}
		}
		errs = append(errs, checkShares(p.Child("shares"), c)...)
	}
	return errs.ToAggregate()
}

// checkShares: each share is of a class the container has exactly one device
// of, and takes a known capacity within its bounds.
func checkShares(p *field.Path, c Container) field.ErrorList {
	var errs field.ErrorList
	for _, class := range slices.Sorted(maps.Keys(c.Shares)) {
		ids, ok := c.Classes[class]
		if !ok {
			// Its name was not checked: not echoed, it may be huge.
			if len(class) > maxClassNameLength {
				class = class[:maxClassNameLength] + "…"
			}
			errs = append(errs, field.Invalid(p, class, "a share of a class the container has no device of"))
			continue
		}
		sp := p.Key(strconv.Quote(class))
		if len(ids) != 1 {
			errs = append(errs, field.Invalid(sp, len(ids), "a share is of exactly one device"))
		}
		share := c.Shares[class]
		if len(share) == 0 {
			errs = append(errs, field.Required(sp, "a share takes memory, compute or both"))
		}
		for _, name := range slices.Sorted(maps.Keys(share)) {
			v := share[name]
			switch name {
			case v1alpha1.CapacityMemory:
				if v <= 0 || v > MaxShareMemory {
					errs = append(errs, field.Invalid(sp.Key(name), v, fmt.Sprintf("memory must be more than 0 and at most %d bytes", MaxShareMemory)))
				}
			case v1alpha1.CapacityCompute:
				if v <= 0 || v > 100 {
					errs = append(errs, field.Invalid(sp.Key(name), v, "compute must be a percentage from 1 to 100"))
				}
			default:
				if len(name) > 63 {
					name = name[:63] + "…"
				}
				errs = append(errs, field.NotSupported(sp, name, []string{v1alpha1.CapacityMemory, v1alpha1.CapacityCompute}))
			}
		}
	}
	return errs
}

// MaxShareMemory bounds a share's memory: 4Ei, the most a device may
// publish (docs/resource-classes.md, "Bounds").
const MaxShareMemory = 4 * v1alpha1.MaxShareMemoryBytes

// checkName reports an empty, too long or malformed name without echoing a huge
// value into the error.
func checkName(p *field.Path, name string, maxLen int, check func(string) []string) field.ErrorList {
	switch {
	case name == "":
		return field.ErrorList{field.Required(p, "empty name")}
	case len(name) > maxLen:
		return field.ErrorList{field.TooLong(p, name, maxLen)}
	}
	var errs field.ErrorList
	for _, msg := range check(name) {
		errs = append(errs, field.Invalid(p, name, msg))
	}
	return errs
}

// printable also keeps ids free of what JSON would encode longer than Decode read
// it (control characters, U+2028) or not at all (invalid UTF-8), see Encode.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// Devices returns the device ids given to container for class, nil if none.
func (a *Assignment) Devices(container, class string) []string {
	for _, c := range a.Containers {
		if c.Name == container {
			return slices.Clone(c.Classes[class])
		}
	}
	return nil
}

// DeviceIDs returns every device id of the assignment, sorted.
func (a *Assignment) DeviceIDs() []string {
	var ids []string
	for _, c := range a.Containers {
		for _, classIDs := range c.Classes {
			ids = append(ids, classIDs...)
		}
	}
	slices.Sort(ids)
	return ids
}

// Annotations returns every annotation to write for a: the structured one and the
// compat keys. A caller replacing an assignment first drops the keys for which
// IsAnnotation is true, so no stale compat key survives.
func Annotations(a *Assignment) (map[string]string, error) {
	s, err := Encode(a)
	if err != nil {
		return nil, err
	}
	out := map[string]string{AnnotationKey: s}
	for _, c := range a.Containers {
		for class, ids := range c.Classes {
			for _, id := range ids {
				// Each device is one unit (a device shared by two
				// containers is still one device).
				out[CompatKey(class, id)] = "1"
			}
		}
	}
	return out, nil
}

// FromPod returns the assignment a pod carries. found is false, with a nil error,
// when the pod has none (not scheduled by resclass, or not bound yet).
func FromPod(pod *corev1.Pod) (a *Assignment, found bool, err error) {
	s, ok := pod.Annotations[AnnotationKey]
	if !ok {
		return nil, false, nil
	}
	a, err = Decode(s)
	if err != nil {
		return nil, true, fmt.Errorf("pod %s/%s: annotation %s: %w", pod.Namespace, pod.Name, AnnotationKey, err)
	}
	return a, true, nil
}

// IsAnnotation reports whether key is one this package writes.
func IsAnnotation(key string) bool {
	return key == AnnotationKey || strings.HasPrefix(key, CompatKeyPrefix)
}
