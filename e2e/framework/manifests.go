package framework

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// ApplyManifest server-side applies every object of a multi-document YAML file,
// as `kubectl apply --server-side -f path` does, and returns them.
func (c *Cluster) ApplyManifest(ctx context.Context, path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return c.ApplyManifestData(ctx, path, data)
}

// ApplyManifestData is ApplyManifest for a manifest already read; name labels
// errors.
func (c *Cluster) ApplyManifestData(ctx context.Context, path string, data []byte) ([]*unstructured.Unstructured, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	client, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	decoder := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := decoder.Decode(&obj.Object); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return out, fmt.Errorf("%s: %w", path, err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return out, fmt.Errorf("%s: %s %s: %w", path, gvk, obj.GetName(), err)
		}
		ri := client.Resource(mapping.Resource).Namespace(obj.GetNamespace())
		applied, err := ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "resclass-e2e", Force: true})
		if err != nil {
			return out, fmt.Errorf("%s: applying %s %s: %w", path, gvk.Kind, obj.GetName(), err)
		}
		out = append(out, applied)
	}
}
