package distribution

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// secretValue is a value no message, log line or error may ever contain.
const secretValue = "hunter2-Zq9-very-secret"

var (
	resourcePath = field.NewPath("spec", "resource")
	testNow      = time.Date(2021, 7, 20, 3, 0, 0, 0, time.FixedZone("x", 3600))
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func raw(s string) runtime.RawExtension { return runtime.RawExtension{Raw: []byte(s)} }

func owner(name, uid string) *v1alpha1.ResourceDistribution {
	return &v1alpha1.ResourceDistribution{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid)}}
}

// secretJSON is a Secret with data, stringData (one key overriding data), labels
// and annotations.
var secretJSON = `{
	"apiVersion": "v1", "kind": "Secret",
	"metadata": {"name": "pull-secret", "creationTimestamp": null,
		"labels": {"app": "web"}, "annotations": {"note": "n"}},
	"type": "kubernetes.io/dockerconfigjson",
	"data": {".dockerconfigjson": "` + b64(`{"auths":{"r":{"auth":"`+secretValue+`"}}}`) + `", "over": "` + b64("from-data") + `"},
	"stringData": {"over": "from-stringData", "plain": "` + secretValue + `"}
}`

var configMapJSON = `{
	"apiVersion": "v1", "kind": "ConfigMap",
	"metadata": {"name": "settings"},
	"immutable": true,
	"data": {"a.conf": "x=1"},
	"binaryData": {"blob": "` + b64("\x00\x01") + `"}
}`

func mustParse(t testing.TB, s string) *Resource {
	t.Helper()
	r, errs := ParseResource(raw(s), resourcePath)
	if len(errs) > 0 {
		t.Fatalf("ParseResource: %v", errs)
	}
	return r
}

func TestParseResourceSecret(t *testing.T) {
	r := mustParse(t, secretJSON)
	if r.APIVersion != "v1" || r.Kind != KindSecret || r.Name != "pull-secret" {
		t.Errorf("parsed %s %s %s", r.APIVersion, r.Kind, r.Name)
	}
	s := r.obj.(*corev1.Secret)
	if s.StringData != nil {
		t.Error("stringData not folded")
	}
	if got := string(s.Data["over"]); got != "from-stringData" {
		t.Errorf("data[over] = %q, stringData must win", got)
	}
	if got := string(s.Data["plain"]); got != secretValue {
		t.Errorf("data[plain] = %q", got)
	}
	if s.Type != corev1.SecretTypeDockerConfigJson {
		t.Errorf("type = %q", s.Type)
	}
	if gvk := r.GVK(); gvk.Group != "" || gvk.Version != "v1" || gvk.Kind != "Secret" {
		t.Errorf("GVK = %v", gvk)
	}
	if _, ok := r.NewObject().(*corev1.Secret); !ok {
		t.Errorf("NewObject = %T", r.NewObject())
	}
	if len(r.Hash()) != 32 {
		t.Errorf("Hash = %q, want 32 hex digits", r.Hash())
	}
}

func TestParseResourceDefaultsSecretType(t *testing.T) {
	r := mustParse(t, `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"}}`)
	if got := r.obj.(*corev1.Secret).Type; got != corev1.SecretTypeOpaque {
		t.Errorf("type = %q, want Opaque", got)
	}
	opaque := mustParse(t, `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"type":"Opaque"}`)
	if r.Hash() != opaque.Hash() {
		t.Error("an empty type and Opaque hash differently")
	}
}

func TestParseResourceConfigMap(t *testing.T) {
	r := mustParse(t, configMapJSON)
	if r.Kind != KindConfigMap || r.Name != "settings" {
		t.Errorf("parsed %s %s", r.Kind, r.Name)
	}
	c := r.obj.(*corev1.ConfigMap)
	if c.Data["a.conf"] != "x=1" || string(c.BinaryData["blob"]) != "\x00\x01" || !ptr.Deref(c.Immutable, false) {
		t.Errorf("parsed %+v", c)
	}
	if _, ok := r.NewObject().(*corev1.ConfigMap); !ok {
		t.Errorf("NewObject = %T", r.NewObject())
	}
}

func TestParseResourceFromObject(t *testing.T) {
	ext := runtime.RawExtension{Object: &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "from-go"},
		Data:       map[string]string{"k": "v"},
	}}
	r, errs := ParseResource(ext, resourcePath)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if r.Name != "from-go" || r.Kind != KindConfigMap {
		t.Errorf("parsed %s", r)
	}
}

func TestParseResourceRefusals(t *testing.T) {
	secret := func(meta, rest string) string {
		s := `{"apiVersion":"v1","kind":"Secret","metadata":{` + meta + `}`
		if rest != "" {
			s += "," + rest
		}
		return s + "}"
	}
	cm := func(meta, rest string) string {
		s := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{` + meta + `}`
		if rest != "" {
			s += "," + rest
		}
		return s + "}"
	}
	const name = `"name":"n"`
	big := strings.Repeat("x", maxDataBytes)
	tests := []struct {
		name   string
		raw    runtime.RawExtension
		want   []fieldErr
		detail string // a substring of the first error's message
	}{
		{"empty", runtime.RawExtension{}, []fieldErr{{field.ErrorTypeRequired, "spec.resource"}}, ""},
		{"whitespace", raw(" \n"), []fieldErr{{field.ErrorTypeRequired, "spec.resource"}}, ""},
		{"null", raw("null"), []fieldErr{{field.ErrorTypeRequired, "spec.resource"}}, ""},
		{"garbage", raw("{not json " + secretValue), []fieldErr{{field.ErrorTypeInvalid, "spec.resource"}}, "JSON object"},
		{"array", raw(`[1,2]`), []fieldErr{{field.ErrorTypeInvalid, "spec.resource"}}, "JSON object"},
		{"string", raw(`"` + secretValue + `"`), []fieldErr{{field.ErrorTypeInvalid, "spec.resource"}}, "JSON object"},
		{"yaml", raw("apiVersion: v1\nkind: Secret\n"), []fieldErr{{field.ErrorTypeInvalid, "spec.resource"}}, "JSON object"},
		{"trailing garbage", raw(secret(name, "") + "x"), []fieldErr{{field.ErrorTypeInvalid, "spec.resource"}}, ""},

		{"no apiVersion", raw(`{"kind":"Secret","metadata":{"name":"n"}}`),
			[]fieldErr{{field.ErrorTypeRequired, "spec.resource.apiVersion"}}, ""},
		{"apps/v1", raw(`{"apiVersion":"apps/v1","kind":"Secret","metadata":{"name":"n"}}`),
			[]fieldErr{{field.ErrorTypeNotSupported, "spec.resource.apiVersion"}}, "only v1"},
		{"apiVersion number", raw(`{"apiVersion":1,"kind":"Secret"}`),
			[]fieldErr{{field.ErrorTypeTypeInvalid, "spec.resource.apiVersion"}}, "string"},
		{"no kind", raw(`{"apiVersion":"v1","metadata":{"name":"n"}}`),
			[]fieldErr{{field.ErrorTypeRequired, "spec.resource.kind"}}, ""},
		{"Pod", raw(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"n"}}`),
			[]fieldErr{{field.ErrorTypeNotSupported, "spec.resource.kind"}}, "only Secret and ConfigMap can be distributed"},
		{"lower-case kind", raw(`{"apiVersion":"v1","kind":"secret","metadata":{"name":"n"}}`),
			[]fieldErr{{field.ErrorTypeNotSupported, "spec.resource.kind"}}, "only Secret and ConfigMap"},
		{"Kind with a capital K", raw(`{"apiVersion":"v1","Kind":"Secret","metadata":{"name":"n"}}`),
			[]fieldErr{{field.ErrorTypeRequired, "spec.resource.kind"}}, ""},
		{"both wrong", raw(`{"apiVersion":"v2","kind":"Pod"}`), []fieldErr{
			{field.ErrorTypeNotSupported, "spec.resource.apiVersion"},
			{field.ErrorTypeNotSupported, "spec.resource.kind"}}, ""},

		{"no name", raw(secret(``, "")), []fieldErr{{field.ErrorTypeRequired, "spec.resource.metadata.name"}}, ""},
		{"no metadata", raw(`{"apiVersion":"v1","kind":"ConfigMap"}`),
			[]fieldErr{{field.ErrorTypeRequired, "spec.resource.metadata.name"}}, ""},
		{"invalid name", raw(secret(`"name":"Bad_Name"`, "")), []fieldErr{{field.ErrorTypeInvalid, "spec.resource.metadata.name"}}, ""},
		{"namespace", raw(secret(name+`,"namespace":"ns"`, "")),
			[]fieldErr{{field.ErrorTypeInvalid, "spec.resource.metadata.namespace"}}, "leave namespace unset"},
		{"generateName", raw(secret(name+`,"generateName":"n-"`, "")),
			[]fieldErr{{field.ErrorTypeForbidden, "spec.resource.metadata.generateName"}}, ""},
		{"generateName only", raw(secret(`"generateName":"n-"`, "")), []fieldErr{
			{field.ErrorTypeRequired, "spec.resource.metadata.name"},
			{field.ErrorTypeForbidden, "spec.resource.metadata.generateName"}}, ""},
		{"ownerReferences", raw(secret(name+`,"ownerReferences":[{"apiVersion":"v1","kind":"X","name":"x","uid":"u"}]`, "")),
			[]fieldErr{{field.ErrorTypeForbidden, "spec.resource.metadata.ownerReferences"}}, ""},
		{"finalizers", raw(secret(name+`,"finalizers":["x/y"]`, "")),
			[]fieldErr{{field.ErrorTypeForbidden, "spec.resource.metadata.finalizers"}}, ""},
		{"resourceVersion", raw(secret(name+`,"resourceVersion":"5"`, "")),
			[]fieldErr{{field.ErrorTypeForbidden, "spec.resource.metadata.resourceVersion"}}, ""},
		{"uid", raw(cm(name+`,"uid":"abc"`, "")),
			[]fieldErr{{field.ErrorTypeForbidden, "spec.resource.metadata.uid"}}, ""},
		{"deletionTimestamp", raw(cm(name+`,"deletionTimestamp":"2021-07-20T03:00:00Z"`, "")),
			[]fieldErr{{field.ErrorTypeForbidden, "spec.resource.metadata.deletionTimestamp"}}, ""},
		{"managedFields", raw(cm(name+`,"managedFields":[{"manager":"m"}]`, "")),
			[]fieldErr{{field.ErrorTypeForbidden, "spec.resource.metadata.managedFields"}}, ""},
		{"our label", raw(cm(name+`,"labels":{"resclass.io/distribution":"x"}`, "")),
			[]fieldErr{{field.ErrorTypeForbidden, "spec.resource.metadata.labels[resclass.io/distribution]"}}, ""},
		{"our annotations", raw(cm(name+`,"annotations":{"resclass.io/resource-content-hash":"x","resclass.io/resource-distributed-by":"y"}`, "")),
			[]fieldErr{
				{field.ErrorTypeForbidden, "spec.resource.metadata.annotations[resclass.io/resource-content-hash]"},
				{field.ErrorTypeForbidden, "spec.resource.metadata.annotations[resclass.io/resource-distributed-by]"}}, ""},
		{"invalid label value", raw(cm(name+`,"labels":{"a":"not valid!"}`, "")),
			[]fieldErr{{field.ErrorTypeInvalid, "spec.resource.metadata.labels"}}, ""},
		{"invalid annotation key", raw(cm(name+`,"annotations":{"bad key":"x"}`, "")),
			[]fieldErr{{field.ErrorTypeInvalid, "spec.resource.metadata.annotations"}}, ""},

		{"unknown top-level field", raw(cm(name, `"spec":{}`)),
			[]fieldErr{{field.ErrorTypeForbidden, "spec.resource.spec"}}, "unknown field"},
		{"unknown metadata field", raw(cm(name+`,"nickname":"x"`, "")),
			[]fieldErr{{field.ErrorTypeForbidden, "spec.resource.metadata.nickname"}}, "unknown field"},
		{"wrong-case field", raw(cm(name, `"Data":{"k":"v"}`)),
			[]fieldErr{{field.ErrorTypeForbidden, "spec.resource.Data"}}, "case-sensitive"},
		{"type on a ConfigMap", raw(cm(name, `"type":"Opaque"`)),
			[]fieldErr{{field.ErrorTypeForbidden, "spec.resource.type"}}, ""},
		{"stringData on a ConfigMap", raw(cm(name, `"stringData":{"k":"v"}`)),
			[]fieldErr{{field.ErrorTypeForbidden, "spec.resource.stringData"}}, ""},
		{"unknown field and bad name together", raw(cm(`"name":"Bad_Name"`, `"x":1`)), []fieldErr{
			{field.ErrorTypeForbidden, "spec.resource.x"},
			{field.ErrorTypeInvalid, "spec.resource.metadata.name"}}, ""},
		{"duplicate field", raw(cm(name, `"data":{"k":"v"},"data":{"k":"w"}`)),
			[]fieldErr{{field.ErrorTypeInvalid, "spec.resource.data"}}, "more than once"},

		{"data is a string", raw(secret(name, `"data":"`+secretValue+`"`)),
			[]fieldErr{{field.ErrorTypeTypeInvalid, "spec.resource.data"}}, "must be an object, not string"},
		{"immutable is a string", raw(cm(name, `"immutable":"yes"`)),
			[]fieldErr{{field.ErrorTypeTypeInvalid, "spec.resource.immutable"}}, "boolean"},
		{"labels is a list", raw(cm(name+`,"labels":["a"]`, "")),
			[]fieldErr{{field.ErrorTypeTypeInvalid, "spec.resource.metadata.labels"}}, "object"},
		{"data value a number", raw(cm(name, `"data":{"k":12345}`)),
			[]fieldErr{{field.ErrorTypeTypeInvalid, "spec.resource.data"}}, "string, not number"},
		{"Secret data not base64", raw(secret(name, `"data":{"ok":"`+b64("x")+`","bad":"`+secretValue+`!"}`)),
			[]fieldErr{{field.ErrorTypeInvalid, "spec.resource.data[bad]"}}, "base64"},
		{"ConfigMap binaryData not base64", raw(cm(name, `"binaryData":{"bad":"`+secretValue+`!"}`)),
			[]fieldErr{{field.ErrorTypeInvalid, "spec.resource.binaryData[bad]"}}, "base64"},
		{"bad creationTimestamp", raw(cm(name+`,"creationTimestamp":"yesterday"`, "")),
			[]fieldErr{{field.ErrorTypeInvalid, "spec.resource"}}, "cannot be read as a v1 ConfigMap"},

		{"invalid data key", raw(secret(name, `"data":{"a/b":""}`)),
			[]fieldErr{{field.ErrorTypeInvalid, "spec.resource.data[a/b]"}}, ""},
		{"invalid stringData key", raw(secret(name, `"stringData":{"a b":"`+secretValue+`"}`)),
			[]fieldErr{{field.ErrorTypeInvalid, "spec.resource.stringData[a b]"}}, ""},
		{"invalid binaryData key", raw(cm(name, `"binaryData":{"..":""}`)),
			[]fieldErr{{field.ErrorTypeInvalid, "spec.resource.binaryData[..]"}}, ""},
		{"key in data and binaryData", raw(cm(name, `"data":{"k":"v"},"binaryData":{"k":""}`)),
			[]fieldErr{{field.ErrorTypeInvalid, "spec.resource.binaryData[k]"}}, "duplicate"},
		{"Secret too big", raw(secret(name, `"stringData":{"k":"`+big+`x"}`)),
			[]fieldErr{{field.ErrorTypeTooLong, "spec.resource.data"}}, ""},
		{"ConfigMap too big", raw(cm(name, `"data":{"k":"`+big+`"},"binaryData":{"b":"`+b64("x")+`"}`)),
			[]fieldErr{{field.ErrorTypeTooLong, "spec.resource"}}, ""},

		{"TLS without key", raw(secret(name, `"type":"kubernetes.io/tls","stringData":{"tls.crt":"c"}`)),
			[]fieldErr{{field.ErrorTypeRequired, "spec.resource.data[tls.key]"}}, ""},
		{"dockerconfigjson missing", raw(secret(name, `"type":"kubernetes.io/dockerconfigjson"`)),
			[]fieldErr{{field.ErrorTypeRequired, "spec.resource.data[.dockerconfigjson]"}}, ""},
		{"dockerconfigjson not JSON", raw(secret(name, `"type":"kubernetes.io/dockerconfigjson","stringData":{".dockerconfigjson":"`+secretValue+`"}`)),
			[]fieldErr{{field.ErrorTypeInvalid, "spec.resource.data[.dockerconfigjson]"}}, "JSON"},
		{"dockercfg missing", raw(secret(name, `"type":"kubernetes.io/dockercfg"`)),
			[]fieldErr{{field.ErrorTypeRequired, "spec.resource.data[.dockercfg]"}}, ""},
		{"basic-auth empty", raw(secret(name, `"type":"kubernetes.io/basic-auth"`)), []fieldErr{
			{field.ErrorTypeRequired, "spec.resource.data[username]"},
			{field.ErrorTypeRequired, "spec.resource.data[password]"}}, ""},
		{"ssh-auth empty", raw(secret(name, `"type":"kubernetes.io/ssh-auth"`)),
			[]fieldErr{{field.ErrorTypeRequired, "spec.resource.data[ssh-privatekey]"}}, ""},
		// Credential types and custom types are never copied (fence.go).
		{"service-account-token", raw(secret(name+`,"annotations":{"kubernetes.io/service-account.name":"default"}`, `"type":"kubernetes.io/service-account-token"`)),
			[]fieldErr{{field.ErrorTypeNotSupported, "spec.resource.type"}}, "credential"},
		{"bootstrap token", raw(secret(name, `"type":"bootstrap.kubernetes.io/token","stringData":{"token-id":"abcdef","token-secret":"`+secretValue+`"}`)),
			[]fieldErr{{field.ErrorTypeNotSupported, "spec.resource.type"}}, "credential"},
		{"custom Secret type", raw(secret(name, `"type":"helm.sh/release.v1"`)),
			[]fieldErr{{field.ErrorTypeNotSupported, "spec.resource.type"}}, "Opaque"},
		{"Opaque spelled in lower case", raw(secret(name, `"type":"opaque"`)),
			[]fieldErr{{field.ErrorTypeNotSupported, "spec.resource.type"}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, errs := ParseResource(tt.raw, resourcePath)
			if r != nil {
				t.Errorf("ParseResource returned %s with errors", r)
			}
			checkErrs(t, errs, tt.want)
			if msg := errs.ToAggregate(); msg != nil && strings.Contains(msg.Error(), secretValue) {
				t.Errorf("an error shows the secret value: %v", msg)
			}
			if tt.detail != "" && len(errs) > 0 && !strings.Contains(errs[0].Error(), tt.detail) {
				t.Errorf("error %q does not say %q", errs[0].Error(), tt.detail)
			}
		})
	}
}

func TestParseResourceAccepts(t *testing.T) {
	tests := []struct{ name, json string }{
		{"Opaque", `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"t"},"type":"Opaque","data":{"extra":"YmFyCg=="}}`},
		{"dockercfg", `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"t"},"type":"kubernetes.io/dockercfg",
			"stringData":{".dockercfg":"{}"}}`},
		{"ssh-auth", `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"t"},"type":"kubernetes.io/ssh-auth",
			"stringData":{"ssh-privatekey":"k"}}`},
		{"TLS", `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"t"},"type":"kubernetes.io/tls",
			"stringData":{"tls.crt":"c","tls.key":"k"}}`},
		{"basic-auth with a username only", `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"t"},
			"type":"kubernetes.io/basic-auth","stringData":{"username":"u"}}`},
		{"null fields", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","labels":null,"creationTimestamp":null},
			"data":null,"immutable":null}`},
		{"dotted name", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a.b-c"}}`},
		{"exactly the size limit", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"k":"` +
			strings.Repeat("x", maxDataBytes) + `"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mustParse(t, tt.json)
		})
	}
}

func TestCopy(t *testing.T) {
	r := mustParse(t, secretJSON)
	rd := owner("secret-distribution", "uid-1")
	obj := r.Copy("team-a", rd, testNow)
	s, ok := obj.(*corev1.Secret)
	if !ok {
		t.Fatalf("Copy = %T", obj)
	}
	if s.APIVersion != "v1" || s.Kind != "Secret" || s.Name != "pull-secret" || s.Namespace != "team-a" {
		t.Errorf("copy identity %v %s/%s", s.TypeMeta, s.Namespace, s.Name)
	}
	if s.ResourceVersion != "" || s.UID != "" {
		t.Error("copy has server fields")
	}
	wantRef := metav1.OwnerReference{
		APIVersion: "resclass.io/v1alpha1", Kind: "ResourceDistribution", Name: "secret-distribution",
		UID: "uid-1", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}
	if len(s.OwnerReferences) != 1 || !reflect.DeepEqual(s.OwnerReferences[0], wantRef) {
		t.Errorf("ownerReferences = %+v", s.OwnerReferences)
	}
	wantLabels := map[string]string{"app": "web", LabelDistribution: "secret-distribution"}
	if !maps.Equal(s.Labels, wantLabels) {
		t.Errorf("labels = %v", s.Labels)
	}
	wantAnnotations := map[string]string{
		"note":                             "n",
		v1alpha1.AnnotationDistributedBy:   "resource-distribution:secret-distribution",
		v1alpha1.AnnotationDistributedTime: "2021-07-20T02:00:00Z",
		v1alpha1.AnnotationContentHash:     r.Hash(),
	}
	if !maps.Equal(s.Annotations, wantAnnotations) {
		t.Errorf("annotations = %v", s.Annotations)
	}
	if s.StringData != nil || string(s.Data["over"]) != "from-stringData" || string(s.Data["plain"]) != secretValue ||
		len(s.Data) != 3 {
		t.Errorf("data not folded: %v", s.Data)
	}
	if s.Type != corev1.SecretTypeDockerConfigJson || s.Immutable != nil {
		t.Errorf("type %q immutable %v", s.Type, s.Immutable)
	}

	// The copy is the caller's: changing it changes neither the resource nor
	// the next copy.
	s.Data["plain"][0] = 'X'
	s.Data["new"] = nil
	s.Labels["app"] = "changed"
	again := r.Copy("team-a", rd, testNow).(*corev1.Secret)
	if string(again.Data["plain"]) != secretValue || len(again.Data) != 3 || again.Labels["app"] != "web" {
		t.Error("a copy shares memory with the resource")
	}
	if mustParse(t, secretJSON).Hash() != r.Hash() {
		t.Error("hash changed")
	}
}

func TestCopyConfigMap(t *testing.T) {
	r := mustParse(t, configMapJSON)
	c := r.Copy("ns", owner("d", "u"), testNow).(*corev1.ConfigMap)
	if c.Data["a.conf"] != "x=1" || string(c.BinaryData["blob"]) != "\x00\x01" || !ptr.Deref(c.Immutable, false) {
		t.Errorf("copy %+v", c)
	}
	if c.Labels[LabelDistribution] != "d" || c.Annotations[v1alpha1.AnnotationContentHash] != r.Hash() {
		t.Errorf("copy metadata %+v", c.ObjectMeta)
	}
}

func TestCopyLongOwnerName(t *testing.T) {
	r := mustParse(t, configMapJSON)
	long := strings.Repeat("a", 100) + ".example"
	c := r.Copy("ns", owner(long, "u"), testNow)
	v := c.GetLabels()[LabelDistribution]
	if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
		t.Errorf("label value %q: %v", v, msgs)
	}
	if c.GetAnnotations()[v1alpha1.AnnotationDistributedBy] != "resource-distribution:"+long {
		t.Error("distributed-by does not carry the full name")
	}
}

func TestLabelValue(t *testing.T) {
	short := strings.Repeat("a", 63)
	if LabelValue(short) != short || LabelValue("d.x-y") != "d.x-y" {
		t.Error("a name that fits is not kept")
	}
	prefix := strings.Repeat("b", 46) + "."
	l1, l2 := LabelValue(prefix+strings.Repeat("c", 100)), LabelValue(prefix+strings.Repeat("d", 100))
	for _, l := range []string{l1, l2} {
		if msgs := validation.IsValidLabelValue(l); len(msgs) > 0 || len(l) != 63 {
			t.Errorf("LabelValue = %q: %v", l, msgs)
		}
	}
	if l1 == l2 {
		t.Error("two long names share a label value")
	}
}

func TestHash(t *testing.T) {
	base := mustParse(t, secretJSON).Hash()

	same := []struct{ name, json string }{
		{"keys reordered", `{
			"stringData": {"plain": "` + secretValue + `", "over": "from-stringData"},
			"data": {"over": "` + b64("from-data") + `", ".dockerconfigjson": "` + b64(`{"auths":{"r":{"auth":"`+secretValue+`"}}}`) + `"},
			"type": "kubernetes.io/dockerconfigjson",
			"metadata": {"annotations": {"note": "n"}, "labels": {"app": "web"}, "name": "pull-secret"},
			"kind": "Secret", "apiVersion": "v1"}`},
		{"stringData spelled as data", `{"apiVersion": "v1", "kind": "Secret",
			"metadata": {"name": "pull-secret", "labels": {"app": "web"}, "annotations": {"note": "n"}},
			"type": "kubernetes.io/dockerconfigjson",
			"data": {".dockerconfigjson": "` + b64(`{"auths":{"r":{"auth":"`+secretValue+`"}}}`) + `",
				"over": "` + b64("from-stringData") + `", "plain": "` + b64(secretValue) + `"}}`},
	}
	for _, tt := range same {
		t.Run(tt.name, func(t *testing.T) {
			if got := mustParse(t, tt.json).Hash(); got != base {
				t.Errorf("hash %s, want %s", got, base)
			}
		})
	}
	// Go map iteration order differs run to run: hash the same maps many times.
	for range 20 {
		if got := mustParse(t, secretJSON).Hash(); got != base {
			t.Fatal("hash is not deterministic")
		}
	}

	cm := func(body string) string {
		return `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"` + body + `}`
	}
	sec := func(body string) string {
		return `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"c"` + body + `}`
	}
	different := []struct{ name, a, b string }{
		{"data value", sec(`},"data":{"k":"` + b64("1") + `"}`), sec(`},"data":{"k":"` + b64("2") + `"}`)},
		{"data key", sec(`},"data":{"k":""}`), sec(`},"data":{"j":""}`)},
		{"extra data key", sec(`},"data":{"k":""}`), sec(`},"data":{"k":"","j":""}`)},
		{"key and value boundary", cm(`},"data":{"ab":"c"}`), cm(`},"data":{"a":"bc"}`)},
		{"data moved to binaryData", cm(`},"data":{"k":"v"}`), cm(`},"binaryData":{"k":"` + b64("v") + `"}`)},
		{"type", sec(`},"type":"Opaque","stringData":{"ssh-privatekey":"k"}`), sec(`},"type":"kubernetes.io/ssh-auth","stringData":{"ssh-privatekey":"k"}`)},
		{"immutable", cm(`}`), cm(`},"immutable":true`)},
		{"label", cm(`,"labels":{"a":"1"}}`), cm(`,"labels":{"a":"2"}}`)},
		{"label moved to annotation", cm(`,"labels":{"a":"1"}}`), cm(`,"annotations":{"a":"1"}}`)},
		{"annotation", cm(`,"annotations":{"a":"1"}}`), cm(`,"annotations":{"a":"1","b":""}}`)},
		{"kind", cm(`},"data":{"k":"v"}`), sec(`},"stringData":{"k":"v"}`)},
	}
	for _, tt := range different {
		t.Run(tt.name, func(t *testing.T) {
			if mustParse(t, tt.a).Hash() == mustParse(t, tt.b).Hash() {
				t.Error("same hash")
			}
		})
	}

	t.Run("not the distribution's own metadata", func(t *testing.T) {
		r := mustParse(t, secretJSON)
		a := r.Copy("a", owner("one", "u1"), testNow)
		b := r.Copy("b", owner("two", "u2"), testNow.Add(time.Hour))
		if a.GetAnnotations()[v1alpha1.AnnotationContentHash] != b.GetAnnotations()[v1alpha1.AnnotationContentHash] {
			t.Error("copies for other namespaces, owners or times record other hashes")
		}
	})
	t.Run("nil and empty maps", func(t *testing.T) {
		if mustParse(t, cm(`,"labels":{}},"data":{}`)).Hash() != mustParse(t, cm(`}`)).Hash() {
			t.Error("an empty map hashes unlike an absent one")
		}
	})
}

func TestUpToDate(t *testing.T) {
	r := mustParse(t, secretJSON)
	c := r.Copy("ns", owner("d", "u"), testNow)
	if !r.UpToDate(c) {
		t.Error("a fresh copy is not up to date")
	}
	c.(*corev1.Secret).Data["plain"] = []byte("edited directly")
	if !r.UpToDate(c) {
		t.Error("a copy edited directly is to be left alone (seed: not restored)")
	}
	other := mustParse(t, configMapJSON)
	if other.UpToDate(c) {
		t.Error("another resource's copy is up to date")
	}
	stale := c.DeepCopyObject().(client.Object)
	stale.SetAnnotations(map[string]string{v1alpha1.AnnotationContentHash: "old"})
	if r.UpToDate(stale) {
		t.Error("a stale hash is up to date")
	}
	stale.SetAnnotations(nil)
	if r.UpToDate(stale) {
		t.Error("a copy without hash is up to date")
	}
	if r.UpToDate(nil) || r.UpToDate((*corev1.Secret)(nil)) {
		t.Error("nil is up to date")
	}
}

func TestOwned(t *testing.T) {
	r := mustParse(t, configMapJSON)
	rd := owner("d", "uid-1")
	c := r.Copy("ns", rd, testNow)
	notController := c.DeepCopyObject().(client.Object)
	refs := notController.GetOwnerReferences()
	refs[0].Controller = nil
	notController.SetOwnerReferences(refs)
	bare := r.NewObject()

	tests := []struct {
		name     string
		existing client.Object
		owner    *v1alpha1.ResourceDistribution
		want     bool
	}{
		{"own copy", c, rd, true},
		{"same name, other UID", c, owner("d", "uid-2"), false},
		{"owner without UID", c, owner("d", ""), false},
		{"non-controller reference", notController, rd, false},
		{"no references", bare, rd, false},
		{"nil owner", c, nil, false},
		{"nil object", nil, rd, false},
		{"typed nil object", (*corev1.ConfigMap)(nil), rd, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := r.Owned(tt.existing, tt.owner); got != tt.want {
				t.Errorf("Owned = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestApplyTo(t *testing.T) {
	r := mustParse(t, secretJSON)
	rd := owner("d", "uid-1")
	other := metav1.OwnerReference{APIVersion: "v1", Kind: "Thing", Name: "t", UID: "uid-9"}
	existing := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: "pull-secret", Namespace: "ns", ResourceVersion: "42", UID: "copy-uid",
			Labels:      map[string]string{"app": "old", "someone-else": "x", LabelDistribution: "d"},
			Annotations: map[string]string{v1alpha1.AnnotationContentHash: "old", "someone-else": "x"},
			OwnerReferences: []metav1.OwnerReference{other,
				{APIVersion: "resclass.io/v1alpha1", Kind: "ResourceDistribution", Name: "d", UID: "uid-1", Controller: ptr.To(true)}},
		},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{"stale": []byte("x")},
		StringData: map[string]string{"stale": "y"},
	}
	if err := r.ApplyTo(existing, rd, testNow); err != nil {
		t.Fatal(err)
	}
	want := r.Copy("ns", rd, testNow).(*corev1.Secret)
	if existing.ResourceVersion != "42" || existing.UID != "copy-uid" || existing.Name != "pull-secret" || existing.Namespace != "ns" {
		t.Errorf("identity lost: %+v", existing.ObjectMeta)
	}
	if !maps.Equal(existing.Labels, want.Labels) || !maps.Equal(existing.Annotations, want.Annotations) {
		t.Errorf("labels %v annotations %v, want exactly the resource's plus ours", existing.Labels, existing.Annotations)
	}
	if len(existing.OwnerReferences) != 2 || !reflect.DeepEqual(existing.OwnerReferences[0], other) ||
		!reflect.DeepEqual(existing.OwnerReferences[1], OwnerReference(rd)) {
		t.Errorf("ownerReferences = %+v", existing.OwnerReferences)
	}
	if existing.StringData != nil || len(existing.Data) != len(want.Data) || string(existing.Data["plain"]) != secretValue {
		t.Errorf("data = %v", existing.Data)
	}
	if !r.UpToDate(existing) || !r.Owned(existing, rd) || r.NeedsRecreate(existing) {
		t.Error("an applied copy is not up to date and owned")
	}

	t.Run("keeps a Secret's type", func(t *testing.T) {
		tls := &corev1.Secret{Type: corev1.SecretTypeTLS}
		if err := r.ApplyTo(tls, rd, testNow); err != nil {
			t.Fatal(err)
		}
		if tls.Type != corev1.SecretTypeTLS {
			t.Errorf("type changed to %q", tls.Type)
		}
	})
	t.Run("ConfigMap", func(t *testing.T) {
		cr := mustParse(t, configMapJSON)
		c := &corev1.ConfigMap{Data: map[string]string{"stale": "x"}, BinaryData: map[string][]byte{"stale": nil}}
		if err := cr.ApplyTo(c, rd, testNow); err != nil {
			t.Fatal(err)
		}
		if len(c.Data) != 1 || len(c.BinaryData) != 1 || !ptr.Deref(c.Immutable, false) || !cr.UpToDate(c) {
			t.Errorf("applied %+v", c)
		}
	})
	t.Run("refusals", func(t *testing.T) {
		for name, obj := range map[string]client.Object{
			"other kind": &corev1.ConfigMap{},
			"not a copy": &corev1.Pod{},
			"nil":        nil,
			"typed nil":  (*corev1.Secret)(nil),
		} {
			if err := r.ApplyTo(obj, rd, testNow); err == nil {
				t.Errorf("%s: no error", name)
			} else if strings.Contains(err.Error(), secretValue) {
				t.Errorf("%s: error shows the secret: %v", name, err)
			}
		}
		if err := r.ApplyTo(&corev1.Secret{}, nil, testNow); err == nil {
			t.Error("nil owner: no error")
		}
	})
}

func TestNeedsRecreate(t *testing.T) {
	secret := mustParse(t, `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"stringData":{"k":"v"}}`)
	immutableSecret := mustParse(t, `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"immutable":true}`)
	cm := mustParse(t, configMapJSON)
	rd := owner("d", "u")
	copyOf := func(r *Resource, mutate func(client.Object)) client.Object {
		c := r.Copy("ns", rd, testNow)
		if mutate != nil {
			mutate(c)
		}
		return c
	}
	stale := func(o client.Object) {
		o.SetAnnotations(map[string]string{v1alpha1.AnnotationContentHash: "old"})
	}
	tests := []struct {
		name     string
		r        *Resource
		existing client.Object
		want     bool
	}{
		{"fresh copy", secret, copyOf(secret, nil), false},
		{"stale mutable copy", secret, copyOf(secret, stale), false},
		{"Secret type changed", secret, copyOf(secret, func(o client.Object) {
			o.(*corev1.Secret).Type = corev1.SecretTypeTLS
		}), true},
		{"Secret without type", secret, &corev1.Secret{}, false},
		{"immutable and up to date", immutableSecret, copyOf(immutableSecret, nil), false},
		{"immutable and stale", immutableSecret, copyOf(immutableSecret, stale), true},
		{"immutable copy, resource no longer immutable", secret, copyOf(immutableSecret, nil), true},
		{"immutable ConfigMap stale", cm, copyOf(cm, stale), true},
		{"immutable ConfigMap up to date", cm, copyOf(cm, nil), false},
		{"other kind", secret, &corev1.ConfigMap{Immutable: ptr.To(true)}, false},
		{"nil", secret, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.NeedsRecreate(tt.existing); got != tt.want {
				t.Errorf("NeedsRecreate = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestImmutableFieldsChanged(t *testing.T) {
	base := &Resource{APIVersion: "v1", Kind: KindSecret, Name: "a"}
	tests := []struct {
		name     string
		old, new *Resource
		want     []fieldErr
	}{
		{"unchanged", base, &Resource{APIVersion: "v1", Kind: KindSecret, Name: "a"}, nil},
		{"content changed only", mustParse(t, configMapJSON), mustParse(t, strings.Replace(configMapJSON, "x=1", "x=2", 1)), nil},
		{"kind", base, &Resource{APIVersion: "v1", Kind: KindConfigMap, Name: "a"},
			[]fieldErr{{field.ErrorTypeForbidden, "spec.resource.kind"}}},
		{"name", base, &Resource{APIVersion: "v1", Kind: KindSecret, Name: "b"},
			[]fieldErr{{field.ErrorTypeForbidden, "spec.resource.metadata.name"}}},
		{"all", base, &Resource{APIVersion: "v2", Kind: KindConfigMap, Name: "b"}, []fieldErr{
			{field.ErrorTypeForbidden, "spec.resource.apiVersion"},
			{field.ErrorTypeForbidden, "spec.resource.kind"},
			{field.ErrorTypeForbidden, "spec.resource.metadata.name"}}},
		{"old did not parse", nil, base, nil},
		{"new did not parse", base, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := ImmutableFieldsChanged(tt.old, tt.new, resourcePath)
			checkErrs(t, errs, tt.want)
			for _, e := range errs {
				if !strings.Contains(e.Detail, "cannot change") {
					t.Errorf("unclear message %q", e.Detail)
				}
			}
		})
	}
}

func TestStringHidesData(t *testing.T) {
	r := mustParse(t, secretJSON)
	encoded, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]string{
		"String":     r.String(),
		"%v":         fmt.Sprintf("%v", r),
		"%+v":        fmt.Sprintf("%+v", r),
		"%#v":        fmt.Sprintf("%#v", r),
		"%s":         fmt.Sprintf("%s", r), //nolint:staticcheck // the %s verb is what is tested
		"value %+v":  fmt.Sprintf("%+v", *r),
		"MarshalLog": fmt.Sprintf("%+v", r.MarshalLog()),
		"JSON":       string(encoded),
	} {
		if strings.Contains(s, secretValue) || strings.Contains(s, b64(secretValue)) {
			t.Errorf("%s shows the secret: %s", name, s)
		}
	}
	if want := "Secret/pull-secret (content " + r.Hash() + ")"; r.String() != want {
		t.Errorf("String = %q, want %q", r.String(), want)
	}
	if (*Resource)(nil).String() != "<nil>" {
		t.Error("nil String")
	}
}
