package kubectlplugin

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/selector"
)

// maxClassFile bounds what preview reads: a class is a few hundred bytes, and
// the apiserver refuses requests over 3 MiB anyway.
const maxClassFile = 1 << 20

// readClassFile reads path ("-": in) with readClass.
func readClassFile(path string, in io.Reader) (*v1alpha1.ResourceClass, error) {
	r := in
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer func() { _ = f.Close() }()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, maxClassFile+1))
	if err != nil {
		return nil, err
	}
	rc, err := readClass(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rc, nil
}

// readClass parses one ResourceClass (YAML or JSON) strictly, and checks its
// name and selectors as the CRD and the webhook do, so that preview answers
// only for a class the cluster would accept.
func readClass(data []byte) (*v1alpha1.ResourceClass, error) {
	if len(data) > maxClassFile {
		return nil, fmt.Errorf("more than %d bytes: not one ResourceClass", maxClassFile)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("empty: want one ResourceClass")
	}
	rc := &v1alpha1.ResourceClass{}
	if err := yaml.UnmarshalStrict(data, rc); err != nil {
		return nil, fmt.Errorf("not one ResourceClass: %w", err)
	}
	if rc.APIVersion != v1alpha1.SchemeGroupVersion.String() || rc.Kind != "ResourceClass" {
		return nil, fmt.Errorf("apiVersion %q, kind %q: want %s ResourceClass", rc.APIVersion, rc.Kind, v1alpha1.SchemeGroupVersion)
	}
	var errs field.ErrorList
	if rc.Name == "" {
		errs = append(errs, field.Required(field.NewPath("metadata", "name"), "the class's name, as pods request it: class.resclass.io/<name>"))
	}
	for _, msg := range validation.IsDNS1123Subdomain(rc.Name) {
		if rc.Name != "" {
			errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), rc.Name, msg))
		}
	}
	errs = append(errs, selector.Validate(&rc.Spec, field.NewPath("spec"))...)
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	rc.UID = "preview"
	return rc, nil
}
