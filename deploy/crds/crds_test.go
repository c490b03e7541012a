package crds

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/install"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/model"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	metavalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/cel/common"
	"sigs.k8s.io/yaml"
)

const (
	group   = "resclass.io"
	version = "v1alpha1"
)

// wantKinds are the kinds the package must embed, each exactly once.
var wantKinds = []string{"NodeDevices", "ResourceClass", "ResourceDistribution"}

// toInternal defaults a v1 CRD and converts it to the internal version, as the
// apiserver does when it decodes a create request.
func toInternal(t *testing.T, in *apiextensionsv1.CustomResourceDefinition) *apiextensions.CustomResourceDefinition {
	t.Helper()
	scheme := runtime.NewScheme()
	install.Install(scheme)
	v1 := in.DeepCopy()
	scheme.Default(v1)
	out := &apiextensions.CustomResourceDefinition{}
	if err := scheme.Convert(v1, out, nil); err != nil {
		t.Fatalf("converting %s to internal: %v", in.Name, err)
	}
	return out
}

// prepareForCreate does what the CRD registry strategy does before validating a
// created CRD: reset the status and record the storage version.
func prepareForCreate(crd *apiextensions.CustomResourceDefinition) {
	crd.Status = apiextensions.CustomResourceDefinitionStatus{}
	crd.Generation = 1
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			crd.Status.StoredVersions = []string{v.Name}
			break
		}
	}
}

// validateCRD runs the apiserver's create validation on a CRD.
func validateCRD(crd *apiextensions.CustomResourceDefinition) field.ErrorList {
	crd = crd.DeepCopy()
	prepareForCreate(crd)
	return crdvalidation.ValidateCustomResourceDefinition(context.Background(), crd)
}

// internalCRDs decodes the embedded CRDs and converts them, keyed by kind.
func internalCRDs(t *testing.T) map[string]*apiextensions.CustomResourceDefinition {
	t.Helper()
	all, err := All()
	if err != nil {
		t.Fatalf("All: %v", err)
	}
	byKind := map[string]*apiextensions.CustomResourceDefinition{}
	for _, crd := range all {
		kind := crd.Spec.Names.Kind
		if _, dup := byKind[kind]; dup {
			t.Fatalf("kind %s is defined twice", kind)
		}
		byKind[kind] = toInternal(t, crd)
	}
	return byKind
}

func TestAllEmbedsEveryKind(t *testing.T) {
	byKind := internalCRDs(t)
	if len(byKind) != len(wantKinds) {
		t.Errorf("got %d CRDs, want %d (%v)", len(byKind), len(wantKinds), wantKinds)
	}
	for _, kind := range wantKinds {
		if byKind[kind] == nil {
			t.Errorf("no CRD for kind %s", kind)
		}
	}
}

func TestCRDsAreValid(t *testing.T) {
	for kind, crd := range internalCRDs(t) {
		t.Run(kind, func(t *testing.T) {
			for _, err := range validateCRD(crd) {
				t.Errorf("the apiserver would reject the CRD: %v", err)
			}
			if crd.Spec.Group != group {
				t.Errorf("group %q, want %q", crd.Spec.Group, group)
			}
			if crd.Spec.Scope != apiextensions.ClusterScoped {
				t.Errorf("scope %q, want %q", crd.Spec.Scope, apiextensions.ClusterScoped)
			}
			if p := crd.Spec.PreserveUnknownFields; p != nil && *p {
				t.Errorf("spec.preserveUnknownFields is set; the schema would not prune")
			}
			if len(crd.Spec.Versions) != 1 {
				t.Fatalf("got %d versions, want only %s", len(crd.Spec.Versions), version)
			}
			v := crd.Spec.Versions[0]
			if v.Name != version || !v.Served || !v.Storage {
				t.Errorf("version %s served=%v storage=%v, want %s served and stored", v.Name, v.Served, v.Storage, version)
			}
			sub := v.Subresources
			if sub == nil {
				sub = crd.Spec.Subresources
			}
			if sub == nil || sub.Status == nil {
				t.Errorf("no status subresource")
			}
		})
	}
}

// TestCRDValidationCatchesBrokenSchemas shows that TestCRDsAreValid can fail: the
// same validation rejects a CRD with a CEL rule that does not compile, one whose
// estimated cost is over the limit, and one whose schema is not structural.
func TestCRDValidationCatchesBrokenSchemas(t *testing.T) {
	byKind := internalCRDs(t)
	for _, tc := range []struct {
		name   string
		kind   string
		mutate func(root *apiextensions.JSONSchemaProps)
		want   string
	}{
		{
			name: "CEL rule does not compile",
			kind: "ResourceClass",
			mutate: func(root *apiextensions.JSONSchemaProps) {
				root.XValidations = append(root.XValidations, apiextensions.ValidationRule{Rule: "self.spec.noSuchField == 1"})
			},
			want: "compilation failed",
		},
		{
			name: "CEL rule over the cost limit",
			kind: "NodeDevices",
			mutate: func(root *apiextensions.JSONSchemaProps) {
				root.XValidations = append(root.XValidations, apiextensions.ValidationRule{
					Rule: "self.status.devices.all(a, self.status.devices.all(b, self.status.devices.all(c, a.id + b.id + c.id != '')))",
				})
			},
			want: "exceeds budget",
		},
		{
			name: "not structural: property without a type",
			kind: "ResourceDistribution",
			mutate: func(root *apiextensions.JSONSchemaProps) {
				spec := root.Properties["spec"]
				targets := spec.Properties["targets"]
				targets.Type = ""
				spec.Properties["targets"] = targets
				root.Properties["spec"] = spec
			},
			want: "must not be empty for specified object fields",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			crd := byKind[tc.kind].DeepCopy()
			tc.mutate(schemaOf(t, crd))
			errs := validateCRD(crd)
			if !strings.Contains(errs.ToAggregate().Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", errs, tc.want)
			}
		})
	}
}

func schemaOf(t *testing.T, crd *apiextensions.CustomResourceDefinition) *apiextensions.JSONSchemaProps {
	t.Helper()
	for _, v := range crd.Spec.Versions {
		if v.Name == version && v.Schema != nil && v.Schema.OpenAPIV3Schema != nil {
			return v.Schema.OpenAPIV3Schema
		}
	}
	if crd.Spec.Validation != nil && crd.Spec.Validation.OpenAPIV3Schema != nil {
		return crd.Spec.Validation.OpenAPIV3Schema
	}
	t.Fatalf("%s has no schema for %s", crd.Name, version)
	return nil
}

// crValidator validates custom resources of one CRD version the way the
// apiserver's customresource registry strategies do (pkg/registry/customresource):
// the OpenAPI schema validator, embedded ObjectMeta/TypeMeta checks, list-type
// invariants, and then the CEL rules, with validation ratcheting as in 1.36.
type crValidator struct {
	kind            string
	structural      *structuralschema.Structural
	schemaValidator apiservervalidation.SchemaValidator
	statusValidator apiservervalidation.SchemaValidator
	cel             *cel.Validator
}

func newCRValidator(t *testing.T, crd *apiextensions.CustomResourceDefinition) *crValidator {
	t.Helper()
	props := schemaOf(t, crd)
	s, err := structuralschema.NewStructural(props)
	if err != nil {
		t.Fatalf("structural schema: %v", err)
	}
	sv, _, err := apiservervalidation.NewSchemaValidator(props)
	if err != nil {
		t.Fatalf("schema validator: %v", err)
	}
	statusProps, ok := props.Properties["status"]
	if !ok {
		t.Fatalf("%s has no status schema", crd.Name)
	}
	statusV, _, err := apiservervalidation.NewSchemaValidator(&statusProps)
	if err != nil {
		t.Fatalf("status schema validator: %v", err)
	}
	return &crValidator{
		kind:            crd.Spec.Names.Kind,
		structural:      s,
		schemaValidator: sv,
		statusValidator: statusV,
		// nil when the schema has no x-kubernetes-validations
		cel: cel.NewValidator(s, true, celconfig.PerCallLimit),
	}
}

// blocking mirrors hasBlockingErr in the customresource strategy: after these
// errors the CEL rules are not evaluated.
func blocking(errs field.ErrorList) bool {
	for _, err := range errs {
		switch err.Type {
		case field.ErrorTypeNotSupported, field.ErrorTypeRequired, field.ErrorTypeTooLong, field.ErrorTypeTooMany, field.ErrorTypeTypeInvalid:
			return true
		}
	}
	return false
}

func (v *crValidator) typeMeta(u *unstructured.Unstructured) field.ErrorList {
	var errs field.ErrorList
	if u.GetKind() != v.kind {
		errs = append(errs, field.Invalid(field.NewPath("kind"), u.GetKind(), "must be "+v.kind))
	}
	if u.GetAPIVersion() != group+"/"+version {
		errs = append(errs, field.Invalid(field.NewPath("apiVersion"), u.GetAPIVersion(), "must be "+group+"/"+version))
	}
	return errs
}

func (v *crValidator) celRules(ctx context.Context, errs field.ErrorList, obj, old *unstructured.Unstructured, opts ...cel.Option) field.ErrorList {
	if v.cel == nil {
		return errs
	}
	if blocking(errs) {
		return append(errs, field.Invalid(nil, nil, "some validation rules were not checked because the object was invalid"))
	}
	var oldObj interface{}
	if old != nil {
		oldObj = old.Object
	}
	celErrs, _ := v.cel.Validate(ctx, nil, v.structural, obj.Object, oldObj, celconfig.RuntimeCELCostBudget, opts...)
	return append(errs, celErrs...)
}

// create validates a create request (customResourceStrategy.PrepareForCreate and
// Validate).
func (v *crValidator) create(ctx context.Context, obj *unstructured.Unstructured) field.ErrorList {
	delete(obj.Object, "status") // create cannot set status
	obj.SetGeneration(1)
	if errs := v.typeMeta(obj); len(errs) > 0 {
		return errs
	}
	var errs field.ErrorList
	errs = append(errs, metavalidation.ValidateObjectMetaAccessor(obj, false, metavalidation.NameIsDNSSubdomain, field.NewPath("metadata"))...)
	errs = append(errs, apiservervalidation.ValidateCustomResource(nil, obj.Object, v.schemaValidator)...)
	errs = append(errs, schemaobjectmeta.Validate(nil, obj.Object, v.structural, false)...)
	errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, v.structural, obj.Object)...)
	return v.celRules(ctx, errs, obj, nil)
}

// update validates an update of the main resource (customResourceStrategy
// PrepareForUpdate and ValidateUpdate): status changes are dropped.
func (v *crValidator) update(ctx context.Context, obj, old *unstructured.Unstructured) field.ErrorList {
	if s, ok := old.Object["status"]; ok {
		obj.Object["status"] = s
	} else {
		delete(obj.Object, "status")
	}
	if errs := v.typeMeta(obj); len(errs) > 0 {
		return errs
	}
	correlated := common.NewCorrelatedObject(obj.Object, old.Object, &model.Structural{Structural: v.structural})
	var errs field.ErrorList
	errs = append(errs, metavalidation.ValidateObjectMetaAccessorUpdate(obj, old, field.NewPath("metadata"))...)
	errs = append(errs, apiservervalidation.ValidateCustomResourceUpdate(nil, obj.Object, old.Object, v.schemaValidator, apiservervalidation.WithRatcheting(correlated))...)
	errs = append(errs, schemaobjectmeta.Validate(nil, obj.Object, v.structural, false)...)
	if oldErrs := structurallisttype.ValidateListSetsAndMaps(nil, v.structural, old.Object); len(oldErrs) == 0 {
		errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, v.structural, obj.Object)...)
	}
	return v.celRules(ctx, errs, obj, old, cel.WithRatcheting(correlated))
}

// updateStatus validates a write to the status subresource (statusStrategy
// PrepareForUpdate and ValidateUpdate): everything but status is taken from old.
func (v *crValidator) updateStatus(ctx context.Context, obj, old *unstructured.Unstructured) field.ErrorList {
	status, hasStatus := obj.Object["status"]
	*obj = *old.DeepCopy()
	if hasStatus {
		obj.Object["status"] = status
	} else {
		delete(obj.Object, "status")
	}
	if errs := v.typeMeta(obj); len(errs) > 0 {
		return errs
	}
	correlated := common.NewCorrelatedObject(obj.Object, old.Object, &model.Structural{Structural: v.structural})
	var errs field.ErrorList
	errs = append(errs, metavalidation.ValidateObjectMetaAccessorUpdate(obj, old, field.NewPath("metadata"))...)
	if hasStatus {
		errs = append(errs, apiservervalidation.ValidateCustomResourceUpdate(field.NewPath("status"), status, old.Object["status"], v.statusValidator, apiservervalidation.WithRatcheting(correlated.Key("status")))...)
	}
	if newErrs := structurallisttype.ValidateListSetsAndMaps(nil, v.structural, obj.Object); len(newErrs) > 0 {
		if oldErrs := structurallisttype.ValidateListSetsAndMaps(nil, v.structural, old.Object); len(oldErrs) == 0 {
			errs = append(errs, newErrs...)
		}
	}
	return v.celRules(ctx, errs, obj, old, cel.WithRatcheting(correlated))
}

// crFromYAML decodes a custom resource the way the apiserver does (JSON numbers
// become int64 where they are integers) and checks that the schema knows every
// field: the apiserver would prune an unknown one silently, which would make a
// test case vacuous.
func (v *crValidator) crFromYAML(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		t.Fatalf("bad test YAML: %v", err)
	}
	obj := map[string]interface{}{}
	if err := utiljson.Unmarshal(j, &obj); err != nil {
		t.Fatalf("bad test YAML: %v", err)
	}
	pruned := runtime.DeepCopyJSON(obj)
	if unknown := structuralpruning.PruneWithOptions(pruned, v.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}); len(unknown) > 0 {
		t.Fatalf("test object has fields the schema does not know (the apiserver would prune them): %v", unknown)
	}
	return &unstructured.Unstructured{Object: obj}
}

// crCase is one request against a CRD. With old empty it is a create; otherwise
// an update of the main resource, or of the status subresource with status set.
type crCase struct {
	name   string
	old    string
	obj    string
	status bool
	// deny is empty when the request must be allowed, or a substring of the
	// expected error.
	deny string
}

func runCRCases(t *testing.T, kind string, cases []crCase) {
	t.Helper()
	crd := internalCRDs(t)[kind]
	if crd == nil {
		t.Fatalf("no CRD for %s", kind)
	}
	v := newCRValidator(t, crd)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			obj := v.crFromYAML(t, tc.obj)
			var errs field.ErrorList
			switch {
			case tc.old == "":
				errs = v.create(ctx, obj)
			case tc.status:
				errs = v.updateStatus(ctx, obj, v.crFromYAML(t, tc.old))
			default:
				errs = v.update(ctx, obj, v.crFromYAML(t, tc.old))
			}
			if tc.deny == "" {
				for _, err := range errs {
					t.Errorf("want ALLOWED, got: %v", err)
				}
				return
			}
			if len(errs) == 0 {
				t.Fatalf("want DENIED with %q, got ALLOWED", tc.deny)
			}
			if msg := errs.ToAggregate().Error(); !strings.Contains(msg, tc.deny) {
				t.Errorf("want DENIED with %q, got: %s", tc.deny, msg)
			}
			// A rule that fails to evaluate also denies, but with a message nobody
			// can act on: the intended message must come from the rule itself.
			for _, err := range errs {
				if strings.Contains(err.Detail, "evaluation error") || strings.Contains(err.Detail, "no such key") {
					t.Errorf("a validation rule failed to evaluate: %v", err)
				}
			}
			t.Logf("denied: %s", errs.ToAggregate().Error())
		})
	}
}

// resourceClass builds a ResourceClass with the given name and one selector of
// the given expressions (YAML list items indented for spec.resourceSelector[0]).
func resourceClass(name, expressions string) string {
	return `
apiVersion: resclass.io/v1alpha1
kind: ResourceClass
metadata:
  name: ` + name + `
  resourceVersion: "1"
spec:
  resourceSelector:
  - matchExpressions:
` + expressions
}

const seedExpressions = `
    - key: kind
      operator: In
      values: [nvidia-gpu]
    - key: memory
      operator: GtEq
      values: [30G]
`

func TestResourceClassValidation(t *testing.T) {
	seed := resourceClass("gpu-30g", seedExpressions)
	withStatus := func(doc, allocatable string) string {
		return doc + `
status:
  allocatable: "` + allocatable + `"
  requested: "1"
`
	}
	one := func(op, values string) string {
		s := `
    - key: memory
      operator: ` + op + `
`
		if values != "" {
			s += "      values: " + values + "\n"
		}
		return s
	}
	runCRCases(t, "ResourceClass", []crCase{
		{name: "seed example allowed", obj: seed},
		{name: "Exists without values allowed", obj: resourceClass("c", one("Exists", ""))},
		{name: "Eq with one value allowed", obj: resourceClass("c", one("Eq", "[40Gi]"))},
		{name: "NotIn with two values allowed", obj: resourceClass("c", one("NotIn", "[a, b]"))},
		{name: "name of 63 characters allowed", obj: resourceClass(strings.Repeat("a", 63), seedExpressions)},
		{name: "operator Foo denied", obj: resourceClass("c", one("Foo", `["1"]`)), deny: `Unsupported value: "Foo"`},
		{name: "Gt with two values denied", obj: resourceClass("c", one("Gt", `["1", "2"]`)), deny: "Eq, Gt, GtEq, Lt and LtEq take exactly one value"},
		{name: "Gt without values denied", obj: resourceClass("c", one("Gt", "")), deny: "In and NotIn need at least one value, Eq, Gt, GtEq, Lt and LtEq exactly one"},
		{name: "In with empty values denied", obj: resourceClass("c", one("In", "[]")), deny: "In and NotIn need at least one value"},
		{name: "In without values denied", obj: resourceClass("c", one("In", "")), deny: "In and NotIn need at least one value"},
		{name: "Exists with values denied", obj: resourceClass("c", one("Exists", "[x]")), deny: "Exists and DoesNotExist none"},
		{name: "name of 64 characters denied", obj: resourceClass(strings.Repeat("a", 64), seedExpressions), deny: "name must be at most 63 characters"},
		{
			name: "update changing spec denied",
			old:  seed,
			obj:  resourceClass("gpu-30g", one("GtEq", "[40G]")),
			deny: "spec is immutable",
		},
		{
			name: "update removing the selector denied",
			old:  seed,
			obj:  strings.SplitN(seed, "spec:", 2)[0] + "spec: {}\n",
			deny: "spec is immutable",
		},
		{name: "update with identical spec allowed", old: seed, obj: strings.Replace(seed, "name: gpu-30g", "name: gpu-30g\n  labels: {a: b}", 1)},
		{name: "status update with identical spec allowed", old: withStatus(seed, "2"), obj: withStatus(seed, "3"), status: true},
		{name: "status update from no status allowed", old: seed, obj: withStatus(seed, "3"), status: true},
	})
}

// nodeDevices builds a NodeDevices status write with the given devices (YAML list
// items indented for status.devices).
func nodeDevices(devices string) string {
	return `
apiVersion: resclass.io/v1alpha1
kind: NodeDevices
metadata:
  name: node-a
  resourceVersion: "1"
status:
  summary: {gpus: 1, nics: 0, hugePagePools: 0, unhealthy: 0}
  devices:
` + devices
}

const emptyNodeDevices = `
apiVersion: resclass.io/v1alpha1
kind: NodeDevices
metadata:
  name: node-a
  resourceVersion: "1"
`

func TestNodeDevicesValidation(t *testing.T) {
	gpu := func(kind, attributes string) string {
		return `
  - id: GPU-0d9a5c2e
    kind: ` + kind + `
    healthy: true
    attributes:
` + attributes
	}
	const good = `
      memory: {quantity: 40Gi}
      computeCapability: {version: "8.0"}
      product: {string: NVIDIA A100-SXM4-40GB}
      numaNode: {int: 0}
      migEnabled: {bool: false}
`
	// The node agent writes the inventory through the status subresource.
	cases := []crCase{
		{name: "GPU with typed attributes allowed", obj: nodeDevices(gpu("nvidia-gpu", good))},
		{name: "NIC with bandwidth allowed", obj: nodeDevices(gpu("nic", "      speed: {bandwidth: 100Gbps}\n"))},
		{name: "attribute with int and string denied", obj: nodeDevices(gpu("nvidia-gpu", "      index: {int: 1, string: a}\n")), deny: "attributes.index: Too many: 2: must have at most 1 item"},
		{name: "attribute with no value denied", obj: nodeDevices(gpu("nvidia-gpu", "      index: {}\n")), deny: "attributes.index in body should have at least 1 properties"},
		{name: "kind NVIDIA_GPU denied", obj: nodeDevices(gpu("NVIDIA_GPU", good)), deny: "should match"},
		{name: "quantity that is not a quantity denied", obj: nodeDevices(gpu("nvidia-gpu", "      memory: {quantity: lots}\n")), deny: "should match"},
		{name: "duplicate device id denied", obj: nodeDevices(gpu("nvidia-gpu", good) + gpu("nvidia-gpu", good)), deny: "Duplicate value"},
	}
	for i := range cases {
		cases[i].old = emptyNodeDevices
		cases[i].status = true
	}
	runCRCases(t, "NodeDevices", cases)
}

// resourceDistribution builds a ResourceDistribution of the given resource (YAML
// indented for spec.resource).
func resourceDistribution(resource string) string {
	return `
apiVersion: resclass.io/v1alpha1
kind: ResourceDistribution
metadata:
  name: dist
  resourceVersion: "1"
spec:
  targets:
    includedNamespaces: [{name: team-a}, {name: team-b}]
  resource:
` + resource
}

func secret(name, data string) string {
	return `
    apiVersion: v1
    kind: Secret
    metadata:
      name: ` + name + `
    type: Opaque
    data:
      token: ` + data + `
`
}

func TestResourceDistributionValidation(t *testing.T) {
	s := resourceDistribution(secret("registry-token", "czNjcjN0"))
	runCRCases(t, "ResourceDistribution", []crCase{
		{name: "Secret allowed", obj: s},
		{name: "ConfigMap allowed", obj: resourceDistribution("    apiVersion: v1\n    kind: ConfigMap\n    metadata: {name: cfg}\n    data: {a: b}\n")},
		{name: "Pod denied", obj: resourceDistribution("    apiVersion: v1\n    kind: Pod\n    metadata: {name: p}\n"), deny: "must be a v1 Secret or ConfigMap"},
		{name: "apps/v1 Secret denied", obj: resourceDistribution("    apiVersion: apps/v1\n    kind: Secret\n    metadata: {name: s}\n"), deny: "must be a v1 Secret or ConfigMap"},
		{name: "missing metadata.name denied", obj: resourceDistribution("    apiVersion: v1\n    kind: Secret\n    metadata: {namespace: default}\n"), deny: "resource.metadata.name is required"},
		{name: "missing metadata denied", obj: resourceDistribution("    apiVersion: v1\n    kind: Secret\n    data: {a: b}\n"), deny: "resource.metadata.name is required"},
		{name: "missing kind denied", obj: resourceDistribution("    apiVersion: v1\n    metadata: {name: s}\n"), deny: "kind"},
		{name: "resource name with a slash denied", obj: resourceDistribution(secret("a/b", "czNjcjN0")), deny: "spec.resource.metadata.name"},
		{name: "resource name that is no DNS subdomain denied", obj: resourceDistribution(secret("Not_A_Name", "czNjcjN0")), deny: "must be a DNS subdomain"},
		{name: "dotted resource name allowed", obj: resourceDistribution(secret("registry.example.com", "czNjcjN0"))},
		{name: "duplicate included namespace denied", obj: strings.Replace(s, "{name: team-b}", "{name: team-a}", 1), deny: "Duplicate value"},
		{
			name: "update changing resource.metadata.name denied",
			old:  s,
			obj:  resourceDistribution(secret("other-token", "czNjcjN0")),
			deny: "resource apiVersion, kind and metadata.name are immutable",
		},
		{
			name: "update changing resource kind denied",
			old:  resourceDistribution("    apiVersion: v1\n    kind: ConfigMap\n    metadata: {name: registry-token}\n"),
			obj:  resourceDistribution("    apiVersion: v1\n    kind: Secret\n    metadata: {name: registry-token}\n"),
			deny: "immutable",
		},
		{name: "update changing only data allowed", old: s, obj: resourceDistribution(secret("registry-token", "bjN3LXMzY3IzdA=="))},
		{name: "update changing targets allowed", old: s, obj: strings.Replace(s, ", {name: team-b}", "", 1)},
	})
}

// TestAllIsStrict shows that decoding rejects fields it does not know and
// documents of another kind.
func TestAllIsStrict(t *testing.T) {
	data, err := FS.ReadFile("resclass.io_resourceclasses.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decode(data); err != nil {
		t.Fatalf("the unmodified file must decode: %v", err)
	}
	for name, doc := range map[string]string{
		"top level":  strings.Replace(string(data), "\nspec:\n", "\nbogus: 1\nspec:\n", 1),
		"wrong kind": strings.Replace(string(data), "kind: CustomResourceDefinition", "kind: ValidatingAdmissionPolicy", 1),
	} {
		t.Run(name, func(t *testing.T) {
			if doc == string(data) {
				t.Fatal("the test did not modify the file")
			}
			if _, err := decode([]byte(doc)); err == nil {
				t.Errorf("decoded without error")
			} else {
				t.Logf("rejected: %v", err)
			}
		})
	}
}

// TestShippedObjectsAreValid admits every example and simulated node profile the
// repository ships as the apiserver would: classes and distributions by create,
// NodeDevices by a status write after create, as the node agent does it.
func TestShippedObjectsAreValid(t *testing.T) {
	files, err := filepath.Glob("../examples/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	profiles, err := filepath.Glob("../../e2e/profiles/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, profiles...)
	if len(files) < 2 {
		t.Fatalf("found only %v", files)
	}
	cases := map[string][]crCase{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range strings.Split(string(data), "\n---\n") {
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil || meta.Kind == "" {
				t.Fatalf("%s document %d: no kind (%v)", f, i, err)
			}
			c := crCase{name: fmt.Sprintf("%s#%d", filepath.Base(f), i), obj: doc}
			if meta.Kind == "NodeDevices" {
				var obj metav1.PartialObjectMetadata
				if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
					t.Fatal(err)
				}
				c.old = fmt.Sprintf("apiVersion: %s\nkind: NodeDevices\nmetadata: {name: %s, resourceVersion: \"1\"}\n", meta.APIVersion, obj.Name)
				c.status = true
			}
			cases[meta.Kind] = append(cases[meta.Kind], c)
		}
	}
	for _, kind := range []string{"ResourceClass", "NodeDevices"} {
		if len(cases[kind]) == 0 {
			t.Errorf("no shipped %s to check", kind)
		}
	}
	for kind, cs := range cases {
		runCRCases(t, kind, cs)
	}
}
