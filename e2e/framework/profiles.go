package framework

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// Profiles lists the simulated hardware profiles in e2e/profiles: each a
// NodeDevices status as a node agent would publish it for that kind of machine.
func Profiles() ([]string, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	files, err := filepath.Glob(filepath.Join(root, "e2e", "profiles", "*.yaml"))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, f := range files {
		names = append(names, strings.TrimSuffix(filepath.Base(f), ".yaml"))
	}
	sort.Strings(names)
	return names, nil
}

// LoadProfile reads the devices of a simulated hardware profile.
func LoadProfile(name string) (v1alpha1.NodeDevicesStatus, error) {
	root, err := RepoRoot()
	if err != nil {
		return v1alpha1.NodeDevicesStatus{}, err
	}
	path := filepath.Join(root, "e2e", "profiles", name+".yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return v1alpha1.NodeDevicesStatus{}, fmt.Errorf("profile %q: %w", name, err)
	}
	var nd v1alpha1.NodeDevices
	if err := yaml.UnmarshalStrict(data, &nd); err != nil {
		return v1alpha1.NodeDevicesStatus{}, fmt.Errorf("%s: %w", path, err)
	}
	return nd.Status, nil
}

// Resclass returns a REST client for the resclass.io/v1alpha1 API, made once.
func (c *Cluster) Resclass() (*rest.RESTClient, error) {
	c.resclassOnce.Do(func() { c.resclass, c.resclassErr = c.newResclassClient() })
	return c.resclass, c.resclassErr
}

func (c *Cluster) newResclassClient() (*rest.RESTClient, error) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(c.Config)
	cfg.GroupVersion = &v1alpha1.SchemeGroupVersion
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	return rest.RESTClientFor(cfg)
}

// PublishNodeDevices writes the NodeDevices of a node as the node agent does: the
// object named after the node and owned by it (so it goes away with the node),
// then its status.
func (c *Cluster) PublishNodeDevices(ctx context.Context, nodeName string, status v1alpha1.NodeDevicesStatus) error {
	node, err := c.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	return c.publishNodeDevices(ctx, node, status)
}

func (c *Cluster) publishNodeDevices(ctx context.Context, node *corev1.Node, status v1alpha1.NodeDevicesStatus) error {
	nodeName := node.Name
	rc, err := c.Resclass()
	if err != nil {
		return err
	}
	nd := &v1alpha1.NodeDevices{
		ObjectMeta: metav1.ObjectMeta{
			Name:            nodeName,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}},
		},
	}
	created := &v1alpha1.NodeDevices{}
	if err := rc.Post().Resource("nodedevices").Body(nd).Do(ctx).Into(created); err != nil {
		return fmt.Errorf("creating NodeDevices %s: %w", nodeName, err)
	}
	created.Status = status
	if err := rc.Put().Resource("nodedevices").Name(nodeName).SubResource("status").Body(created).Do(ctx).Error(); err != nil {
		return fmt.Errorf("writing the status of NodeDevices %s: %w", nodeName, err)
	}
	return nil
}
