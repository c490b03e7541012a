package distribution

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	gojson "encoding/json"
	"errors"
	"fmt"
	"hash"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	sigsjson "sigs.k8s.io/json"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// The kinds a distribution can copy.
const (
	KindSecret    = "Secret"
	KindConfigMap = "ConfigMap"
)

// LabelDistribution is set on every copy to LabelValue(<distribution name>). It lets
// a controller cache and watch only copies (a label selector on
// "resclass.io/distribution" existing) instead of every Secret and ConfigMap in the
// cluster, and lets a person list one distribution's copies with kubectl -l. Which
// distribution owns a copy is decided by its controller owner reference
// (Resource.Owned), never by this label, which anyone can edit.
const LabelDistribution = "resclass.io/distribution"

// DistributedByPrefix starts the v1alpha1.AnnotationDistributedBy value, as the
// seed proposal writes it: "resource-distribution:<name>".
const DistributedByPrefix = "resource-distribution:"

// maxDataBytes is the API server's limit on the summed size of a Secret's or a
// ConfigMap's data (core.MaxSecretSize); a bigger resource could never be copied.
const maxDataBytes = 1 << 20

// reservedAnnotations are written by the distribution on every copy; the resource
// may not set them itself, since they would be overwritten.
var reservedAnnotations = []string{
	v1alpha1.AnnotationDistributedBy,
	v1alpha1.AnnotationDistributedTime,
	v1alpha1.AnnotationContentHash,
}

// omit keeps a bad value out of an error message: the resource may be a Secret and
// its errors end up in events, logs and kubectl output.
var omit = field.OmitValueType{}

// Resource is a parsed, validated spec.resource: the Secret or ConfigMap that a
// distribution copies. Build one with ParseResource; it is immutable afterwards and
// safe for concurrent use.
//
// Its data is private on purpose: String, GoString and MarshalLog print the kind,
// the name and the content hash only, so logging a Resource never logs a secret.
type Resource struct {
	// APIVersion is always "v1".
	APIVersion string
	// Kind is KindSecret or KindConfigMap.
	Kind string
	// Name is the name of every copy.
	Name string

	// obj is the normalized object (*corev1.Secret or *corev1.ConfigMap) without
	// namespace: a Secret's stringData is folded into data and its empty type is
	// Opaque, as the API server would store it.
	obj client.Object
	// hash is Hash(), computed once.
	hash string
}

// ParseResource validates spec.resource and returns it as a Resource. Errors carry
// field paths under path and never the values of data.
//
// The resource must be a complete v1 Secret or ConfigMap with metadata.name (a DNS
// subdomain) and without metadata.namespace (it is copied into the targets) or
// generateName (every copy has the same name). Fields the API server or the
// distribution set (ownerReferences, finalizers, resourceVersion, uid,
// deletionTimestamp, deletionGracePeriodSeconds, managedFields, the label
// LabelDistribution and the distribution's annotations) are refused rather than
// silently dropped. It is decoded strictly (case-sensitive, unknown and duplicate
// fields are errors), and the checks the API server would make on each copy (data
// keys, data size, the keys a typed Secret needs) are made here, once, instead of
// failing in every target namespace.
func ParseResource(raw runtime.RawExtension, path *field.Path) (*Resource, field.ErrorList) {
	data, err := rawJSON(raw)
	if err != nil {
		return nil, field.ErrorList{field.Invalid(path, omit, "cannot be encoded as JSON: "+err.Error())}
	}
	if trimmed := bytes.TrimSpace(data); len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return nil, field.ErrorList{field.Required(path, "the Secret or ConfigMap to distribute is required")}
	}
	var top map[string]gojson.RawMessage
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(data, &top); err != nil || top == nil {
		detail := "must be a JSON object: a complete v1 Secret or ConfigMap"
		if isSyntax, _ := sigsjson.SyntaxErrorOffset(err); isSyntax {
			detail += " (" + err.Error() + ")"
		}
		return nil, field.ErrorList{field.Invalid(path, omit, detail)}
	}

	var errs field.ErrorList
	apiVersion, err1 := stringField(top, "apiVersion", path)
	kind, err2 := stringField(top, "kind", path)
	for _, e := range []*field.Error{err1, err2} {
		if e != nil {
			errs = append(errs, e)
		}
	}
	if err1 == nil {
		switch apiVersion {
		case "":
			errs = append(errs, field.Required(path.Child("apiVersion"), `must be "v1"`))
		case corev1.SchemeGroupVersion.String():
		default:
			e := field.NotSupported(path.Child("apiVersion"), apiVersion, []string{"v1"})
			e.Detail = "only v1 Secrets and ConfigMaps can be distributed; " + e.Detail
			errs = append(errs, e)
		}
	}
	if err2 == nil {
		switch kind {
		case "":
			errs = append(errs, field.Required(path.Child("kind"), `must be "Secret" or "ConfigMap"`))
		case KindSecret, KindConfigMap:
		default:
			e := field.NotSupported(path.Child("kind"), kind, []string{KindConfigMap, KindSecret})
			e.Detail = "only Secret and ConfigMap can be distributed; " + e.Detail
			errs = append(errs, e)
		}
	}
	if len(errs) > 0 {
		// Without a known kind there is no type to decode into.
		return nil, errs
	}

	r := &Resource{APIVersion: apiVersion, Kind: kind}
	r.obj = r.NewObject()
	strictErrs, err := sigsjson.UnmarshalStrict(data, r.obj)
	if err != nil {
		return nil, decodeErrors(err, top, kind, path)
	}
	for _, se := range strictErrs {
		errs = append(errs, strictError(se, kind, path))
	}
	r.Name = r.obj.GetName()
	errs = append(errs, validateMeta(r.obj, path.Child("metadata"))...)
	switch o := r.obj.(type) {
	case *corev1.Secret:
		errs = append(errs, normalizeSecret(o, path)...)
	case *corev1.ConfigMap:
		errs = append(errs, validateConfigMap(o, path)...)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	r.hash = r.computeHash()
	return r, nil
}

// rawJSON returns the bytes of raw: Raw when the extension was decoded from JSON,
// else the encoding of Object (an extension built in Go).
func rawJSON(raw runtime.RawExtension) ([]byte, error) {
	if len(raw.Raw) > 0 || raw.Object == nil {
		return raw.Raw, nil
	}
	return gojson.Marshal(raw.Object)
}

// stringField reads top[key] as a string; missing or null reads as "".
func stringField(top map[string]gojson.RawMessage, key string, path *field.Path) (string, *field.Error) {
	v, ok := top[key]
	if !ok {
		return "", nil
	}
	var s string
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(v, &s); err != nil {
		return "", field.TypeInvalid(path.Child(key), omit, "must be a string")
	}
	return s, nil
}

// strictError turns an unknown or duplicate field reported by the strict decoder
// into a field error at that field.
func strictError(err error, kind string, path *field.Path) *field.Error {
	var fe sigsjson.FieldError
	if !errors.As(err, &fe) {
		return field.Invalid(path, omit, err.Error())
	}
	name := fe.FieldPath()
	if name == "" {
		name = `""` // an empty key; a Path element without a name would print as "[]"
	}
	p := path.Child(name)
	if strings.HasPrefix(err.Error(), "duplicate field") {
		return field.Invalid(p, omit, "is given more than once")
	}
	return field.Forbidden(p, fmt.Sprintf("unknown field: a v1 %s has no such field (field names are case-sensitive)", kind))
}

// decodeErrors explains why the typed decode failed, at the field that failed
// where that is known.
func decodeErrors(err error, top map[string]gojson.RawMessage, kind string, path *field.Path) field.ErrorList {
	var te *gojson.UnmarshalTypeError
	if errors.As(err, &te) {
		p := path
		if te.Field != "" {
			p = path.Child(te.Field)
		}
		// te.Value is "number 5" and the like: keep the JSON type, drop the value.
		got, _, _ := strings.Cut(te.Value, " ")
		return field.ErrorList{field.TypeInvalid(p, omit, fmt.Sprintf("must be %s, not %s", jsonType(te.Type), got))}
	}
	var ce base64.CorruptInputError
	if errors.As(err, &ce) {
		name := "data"
		if kind == KindConfigMap {
			name = "binaryData"
		}
		if errs := base64Errors(top[name], path.Child(name)); len(errs) > 0 {
			return errs
		}
	}
	return field.ErrorList{field.Invalid(path, omit, fmt.Sprintf("cannot be read as a v1 %s: %v", kind, err))}
}

// base64Errors finds the values of a data map that are not base64, which the
// decoder reports without saying where.
func base64Errors(raw gojson.RawMessage, path *field.Path) field.ErrorList {
	var m map[string]gojson.RawMessage
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw, &m); err != nil {
		return nil
	}
	var errs field.ErrorList
	for _, k := range slices.Sorted(maps.Keys(m)) {
		var s string
		if err := sigsjson.UnmarshalCaseSensitivePreserveInts(m[k], &s); err != nil {
			continue
		}
		if _, err := base64.StdEncoding.DecodeString(s); err != nil {
			errs = append(errs, field.Invalid(path.Key(k), omit, "must be base64-encoded"))
		}
	}
	return errs
}

// jsonType names the JSON type a Go type is read from, for messages.
func jsonType(t reflect.Type) string {
	if t == nil {
		return "a different type"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return "a base64-encoded string"
		}
		return "an array"
	case reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "a " + t.String()
}

// validateMeta checks the resource's metadata: what a copy takes from it (name,
// labels, annotations) must be valid, and what the API server or the distribution
// sets must be absent.
func validateMeta(m metav1.Object, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if name := m.GetName(); name == "" {
		errs = append(errs, field.Required(path.Child("name"), "every copy is named metadata.name"))
	} else if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		errs = append(errs, field.Invalid(path.Child("name"), name, strings.Join(msgs, "; ")))
	}
	if m.GetGenerateName() != "" {
		errs = append(errs, field.Forbidden(path.Child("generateName"),
			"every copy has the same name; set metadata.name instead"))
	}
	if ns := m.GetNamespace(); ns != "" {
		errs = append(errs, field.Invalid(path.Child("namespace"), ns,
			"the resource is copied into the target namespaces; leave namespace unset"))
	}
	if len(m.GetOwnerReferences()) > 0 {
		errs = append(errs, field.Forbidden(path.Child("ownerReferences"),
			"every copy is owned by the ResourceDistribution; the controller sets ownerReferences"))
	}
	if len(m.GetFinalizers()) > 0 {
		errs = append(errs, field.Forbidden(path.Child("finalizers"),
			"finalizers on copies would block their garbage collection"))
	}
	const serverSet = "is set by the API server on each copy"
	if m.GetResourceVersion() != "" {
		errs = append(errs, field.Forbidden(path.Child("resourceVersion"), serverSet))
	}
	if m.GetUID() != "" {
		errs = append(errs, field.Forbidden(path.Child("uid"), serverSet))
	}
	if m.GetDeletionTimestamp() != nil {
		errs = append(errs, field.Forbidden(path.Child("deletionTimestamp"), serverSet))
	}
	if m.GetDeletionGracePeriodSeconds() != nil {
		errs = append(errs, field.Forbidden(path.Child("deletionGracePeriodSeconds"), serverSet))
	}
	if len(m.GetManagedFields()) > 0 {
		errs = append(errs, field.Forbidden(path.Child("managedFields"), serverSet))
	}

	labelsPath := path.Child("labels")
	errs = append(errs, metav1validation.ValidateLabels(m.GetLabels(), labelsPath)...)
	if _, ok := m.GetLabels()[LabelDistribution]; ok {
		errs = append(errs, field.Forbidden(labelsPath.Key(LabelDistribution),
			"is set on every copy by the distribution"))
	}
	annotationsPath := path.Child("annotations")
	errs = append(errs, apivalidation.ValidateAnnotations(m.GetAnnotations(), annotationsPath)...)
	for _, k := range reservedAnnotations {
		if _, ok := m.GetAnnotations()[k]; ok {
			errs = append(errs, field.Forbidden(annotationsPath.Key(k),
				"is set on every copy by the distribution"))
		}
	}
	return errs
}

// keyErrors checks the keys of a data map as the API server does.
func keyErrors[V any](m map[string]V, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if msgs := validation.IsConfigMapKey(k); len(msgs) > 0 {
			errs = append(errs, field.Invalid(path.Key(k), k, strings.Join(msgs, "; ")))
		}
	}
	return errs
}

// normalizeSecret validates s and brings it to the form the API server stores:
// stringData folded into data (stringData wins, as on the server) and an empty type
// read as Opaque. Normalizing first keeps the hash and NeedsRecreate from seeing a
// difference between a resource and the copy the server stored.
func normalizeSecret(s *corev1.Secret, path *field.Path) field.ErrorList {
	dataPath := path.Child("data")
	errs := keyErrors(s.Data, dataPath)
	errs = append(errs, keyErrors(s.StringData, path.Child("stringData"))...)
	if len(s.StringData) > 0 {
		if s.Data == nil {
			s.Data = make(map[string][]byte, len(s.StringData))
		}
		for k, v := range s.StringData {
			s.Data[k] = []byte(v)
		}
	}
	s.StringData = nil
	if s.Type == "" {
		s.Type = corev1.SecretTypeOpaque
	}
	size := 0
	for _, v := range s.Data {
		size += len(v)
	}
	if size > maxDataBytes {
		errs = append(errs, field.TooLong(dataPath, "", maxDataBytes))
	}

	if typeErrs := secretTypeErrors(s.Type, path.Child("type")); len(typeErrs) > 0 {
		return append(errs, typeErrs...)
	}
	// The keys the API server requires of a typed Secret (ValidateSecret).
	switch s.Type {
	case corev1.SecretTypeDockercfg:
		errs = append(errs, requireJSONKey(s.Data, corev1.DockerConfigKey, dataPath)...)
	case corev1.SecretTypeDockerConfigJson:
		errs = append(errs, requireJSONKey(s.Data, corev1.DockerConfigJsonKey, dataPath)...)
	case corev1.SecretTypeBasicAuth:
		_, user := s.Data[corev1.BasicAuthUsernameKey]
		_, password := s.Data[corev1.BasicAuthPasswordKey]
		if !user && !password {
			errs = append(errs,
				field.Required(dataPath.Key(corev1.BasicAuthUsernameKey), "a basic-auth Secret needs a username or a password"),
				field.Required(dataPath.Key(corev1.BasicAuthPasswordKey), "a basic-auth Secret needs a username or a password"))
		}
	case corev1.SecretTypeSSHAuth:
		if len(s.Data[corev1.SSHAuthPrivateKey]) == 0 {
			errs = append(errs, field.Required(dataPath.Key(corev1.SSHAuthPrivateKey), "an ssh-auth Secret needs a private key"))
		}
	case corev1.SecretTypeTLS:
		for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey} {
			if _, ok := s.Data[k]; !ok {
				errs = append(errs, field.Required(dataPath.Key(k), "a TLS Secret needs a certificate and a key"))
			}
		}
	}
	return errs
}

func requireJSONKey(data map[string][]byte, key string, path *field.Path) field.ErrorList {
	v, ok := data[key]
	if !ok {
		return field.ErrorList{field.Required(path.Key(key), "")}
	}
	if !gojson.Valid(v) {
		return field.ErrorList{field.Invalid(path.Key(key), omit, "must be valid JSON")}
	}
	return nil
}

func validateConfigMap(c *corev1.ConfigMap, path *field.Path) field.ErrorList {
	errs := keyErrors(c.Data, path.Child("data"))
	binPath := path.Child("binaryData")
	errs = append(errs, keyErrors(c.BinaryData, binPath)...)
	size := 0
	for _, v := range c.Data {
		size += len(v)
	}
	for _, k := range slices.Sorted(maps.Keys(c.BinaryData)) {
		size += len(c.BinaryData[k])
		if _, ok := c.Data[k]; ok {
			errs = append(errs, field.Invalid(binPath.Key(k), k, "duplicate of key present in data"))
		}
	}
	if size > maxDataBytes {
		errs = append(errs, field.TooLong(path, "", maxDataBytes))
	}
	return errs
}

// GVK is the group, version and kind of the resource and its copies.
func (r *Resource) GVK() schema.GroupVersionKind {
	return corev1.SchemeGroupVersion.WithKind(r.Kind)
}

// APIResource is the resource of the kind in the API (secrets, configmaps),
// as RBAC and SubjectAccessReview name it.
func (r *Resource) APIResource() string {
	if r.Kind == KindSecret {
		return "secrets"
	}
	return "configmaps"
}

// NewObject returns an empty object of the resource's kind, to Get or List into.
func (r *Resource) NewObject() client.Object {
	if r.Kind == KindSecret {
		return &corev1.Secret{}
	}
	return &corev1.ConfigMap{}
}

// Hash returns the content hash: hex of the first 16 bytes of a SHA-256 over a
// canonical, length-prefixed encoding of what a copy holds (kind, type, data,
// binaryData, immutable, and the resource's own labels and annotations; map
// entries sorted by key). The distribution's own label and annotations are not
// part of it, so the hash names the content and is equal for every copy.
func (r *Resource) Hash() string { return r.hash }

func (r *Resource) computeHash() string {
	h := hasher{Hash: sha256.New()}
	// A version tag, so that a change of this encoding reads as a change of
	// content, never as a collision with the old one.
	h.str("resclass.io/distribution/content/v1")
	h.str(r.Kind)
	switch o := r.obj.(type) {
	case *corev1.Secret:
		h.str(string(o.Type))
		h.bool(ptr.Deref(o.Immutable, false))
		writeMap(h, o.Data)
		writeMap(h, map[string][]byte(nil))
	case *corev1.ConfigMap:
		h.str("")
		h.bool(ptr.Deref(o.Immutable, false))
		writeMap(h, o.Data)
		writeMap(h, o.BinaryData)
	}
	writeMap(h, r.obj.GetLabels())
	writeMap(h, r.obj.GetAnnotations())
	sum := h.Sum(nil)
	return hex.EncodeToString(sum[:16])
}

type hasher struct{ hash.Hash }

func (h hasher) str(s string) {
	h.Write(binary.AppendUvarint(nil, uint64(len(s))))
	h.Write([]byte(s))
}

func (h hasher) bool(b bool) {
	if b {
		h.Write([]byte{1})
	} else {
		h.Write([]byte{0})
	}
}

// writeMap writes the entry count then each key and value in key order; nil and
// empty maps are the same, as they are on the server.
func writeMap[V ~string | ~[]byte](h hasher, m map[string]V) {
	h.Write(binary.AppendUvarint(nil, uint64(len(m))))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		h.str(k)
		h.str(string(m[k]))
	}
}

// LabelValue is the LabelDistribution value for the distribution name: the name
// itself when it fits a label value (63 characters), else its first 46 characters,
// "-" and 16 hex digits of its SHA-256, so that long names stay distinct.
func LabelValue(name string) string {
	if len(name) <= validation.LabelValueMaxLength {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return name[:validation.LabelValueMaxLength-17] + "-" + hex.EncodeToString(sum[:8])
}

// DistributedBy is the v1alpha1.AnnotationDistributedBy value for the distribution
// name.
func DistributedBy(name string) string { return DistributedByPrefix + name }

// OwnerReference is the controller reference every copy carries to its
// distribution. BlockOwnerDeletion keeps a foreground deletion of the distribution
// waiting for its copies.
func OwnerReference(owner *v1alpha1.ResourceDistribution) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion:         v1alpha1.SchemeGroupVersion.String(),
		Kind:               "ResourceDistribution",
		Name:               owner.Name,
		UID:                owner.UID,
		Controller:         ptr.To(true),
		BlockOwnerDeletion: ptr.To(true),
	}
}

// Copy builds the copy of the resource for namespace, to Create: the content, the
// resource's labels and annotations plus the distribution's (see ApplyTo), and the
// owner reference. owner must not be nil.
func (r *Resource) Copy(namespace string, owner *v1alpha1.ResourceDistribution, now time.Time) client.Object {
	obj := r.NewObject()
	obj.GetObjectKind().SetGroupVersionKind(r.GVK())
	obj.SetName(r.Name)
	obj.SetNamespace(namespace)
	if err := r.ApplyTo(obj, owner, now); err != nil {
		panic(err) // only a nil owner: obj is of the resource's kind
	}
	return obj
}

// ApplyTo rewrites existing, a copy in some namespace, in place to the resource's
// content, for an Update; its name, namespace, resourceVersion and uid are kept.
//
// The copy's labels and annotations become exactly the resource's plus the
// distribution's (LabelDistribution, v1alpha1.AnnotationDistributedBy,
// AnnotationDistributedTime = now in RFC 3339, AnnotationContentHash): keys that
// others added to a copy are dropped, which keeps what a copy holds a function of
// the distribution alone. Owner references other than to owner are kept; the one
// to owner is replaced by OwnerReference(owner).
//
// A Secret's type cannot change and an immutable object's content cannot: check
// NeedsRecreate first. ApplyTo leaves a Secret's type as it is unless it is empty
// (a new object). It fails only for a nil owner or an existing of another kind.
func (r *Resource) ApplyTo(existing client.Object, owner *v1alpha1.ResourceDistribution, now time.Time) error {
	if owner == nil {
		return errors.New("distribution: a copy needs its owning ResourceDistribution")
	}
	if isNil(existing) {
		return fmt.Errorf("distribution: no object to apply %s to", r)
	}
	switch e := existing.(type) {
	case *corev1.Secret:
		src, ok := r.obj.(*corev1.Secret)
		if !ok {
			return fmt.Errorf("distribution: a Secret cannot hold a copy of %s", r)
		}
		e.Data = cloneBytesMap(src.Data)
		e.StringData = nil
		if e.Type == "" {
			e.Type = src.Type
		}
		e.Immutable = cloneBool(src.Immutable)
	case *corev1.ConfigMap:
		src, ok := r.obj.(*corev1.ConfigMap)
		if !ok {
			return fmt.Errorf("distribution: a ConfigMap cannot hold a copy of %s", r)
		}
		e.Data = maps.Clone(src.Data)
		e.BinaryData = cloneBytesMap(src.BinaryData)
		e.Immutable = cloneBool(src.Immutable)
	default:
		return fmt.Errorf("distribution: a %T cannot hold a copy of %s", existing, r)
	}

	labels := maps.Clone(r.obj.GetLabels())
	if labels == nil {
		labels = make(map[string]string, 1)
	}
	labels[LabelDistribution] = LabelValue(owner.Name)
	existing.SetLabels(labels)

	annotations := maps.Clone(r.obj.GetAnnotations())
	if annotations == nil {
		annotations = make(map[string]string, len(reservedAnnotations))
	}
	annotations[v1alpha1.AnnotationDistributedBy] = DistributedBy(owner.Name)
	annotations[v1alpha1.AnnotationDistributedTime] = now.UTC().Format(time.RFC3339)
	annotations[v1alpha1.AnnotationContentHash] = r.hash
	existing.SetAnnotations(annotations)

	var refs []metav1.OwnerReference
	for _, ref := range existing.GetOwnerReferences() {
		if ref.UID != owner.UID {
			refs = append(refs, ref)
		}
	}
	existing.SetOwnerReferences(append(refs, OwnerReference(owner)))
	return nil
}

// UpToDate reports whether existing records the resource's content hash. Only the
// recorded hash is compared, not the data: as the seed asks, a copy edited
// directly is not reverted, and it is rewritten when the resource changes.
func (r *Resource) UpToDate(existing client.Object) bool {
	if isNil(existing) {
		return false
	}
	return existing.GetAnnotations()[v1alpha1.AnnotationContentHash] == r.hash
}

// Owned reports whether owner is existing's controller, by UID: a same-named
// object that the distribution did not create (or that a deleted distribution of
// the same name created) is a conflict to leave alone, not a copy to overwrite.
func (r *Resource) Owned(existing client.Object, owner *v1alpha1.ResourceDistribution) bool {
	if isNil(existing) || owner == nil || owner.UID == "" {
		return false
	}
	ref := metav1.GetControllerOfNoCopy(existing)
	return ref != nil && ref.UID == owner.UID
}

// NeedsRecreate reports whether existing cannot be updated to the resource and has
// to be deleted and created again: a Secret whose type differs (the type of a
// Secret is immutable), or an immutable Secret or ConfigMap that is not UpToDate.
// existing must be of the resource's kind (see NewObject); for anything else it
// reports false and ApplyTo fails.
func (r *Resource) NeedsRecreate(existing client.Object) bool {
	if isNil(existing) {
		return false
	}
	switch e := existing.(type) {
	case *corev1.Secret:
		src, ok := r.obj.(*corev1.Secret)
		if !ok {
			return false
		}
		if e.Type != "" && e.Type != src.Type {
			return true
		}
		return ptr.Deref(e.Immutable, false) && !r.UpToDate(existing)
	case *corev1.ConfigMap:
		if _, ok := r.obj.(*corev1.ConfigMap); !ok {
			return false
		}
		return ptr.Deref(e.Immutable, false) && !r.UpToDate(existing)
	}
	return false
}

// ImmutableFieldsChanged is the update check of the seed's webhook: a
// distribution's resource keeps its apiVersion, kind and metadata.name, because
// the copies are found by them; changing them would orphan the old copies. A nil
// old or new (one that did not parse) is not compared.
func ImmutableFieldsChanged(old, new *Resource, path *field.Path) field.ErrorList {
	if old == nil || new == nil {
		return nil
	}
	var errs field.ErrorList
	const hint = "; create a new ResourceDistribution to distribute another object"
	if old.APIVersion != new.APIVersion {
		errs = append(errs, field.Forbidden(path.Child("apiVersion"),
			fmt.Sprintf("cannot change from %q to %q%s", old.APIVersion, new.APIVersion, hint)))
	}
	if old.Kind != new.Kind {
		errs = append(errs, field.Forbidden(path.Child("kind"),
			fmt.Sprintf("cannot change from %q to %q%s", old.Kind, new.Kind, hint)))
	}
	if old.Name != new.Name {
		errs = append(errs, field.Forbidden(path.Child("metadata", "name"),
			fmt.Sprintf("cannot change from %q to %q%s", old.Name, new.Name, hint)))
	}
	return errs
}

// String names the resource and its content hash, never its data.
func (r *Resource) String() string {
	if r == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%s/%s (content %s)", r.Kind, r.Name, r.hash)
}

// GoString keeps %#v from printing the data.
func (r *Resource) GoString() string { return r.String() }

// MarshalLog is what logr-based loggers print for a Resource: no data.
func (r *Resource) MarshalLog() any {
	if r == nil {
		return nil
	}
	return struct{ Kind, Name, Hash string }{r.Kind, r.Name, r.hash}
}

func isNil(obj client.Object) bool {
	if obj == nil {
		return true
	}
	v := reflect.ValueOf(obj)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

func cloneBytesMap(m map[string][]byte) map[string][]byte {
	if m == nil {
		return nil
	}
	out := make(map[string][]byte, len(m))
	for k, v := range m {
		out[k] = bytes.Clone(v)
	}
	return out
}

func cloneBool(b *bool) *bool {
	if b == nil {
		return nil
	}
	return ptr.To(*b)
}
