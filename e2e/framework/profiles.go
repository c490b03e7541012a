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
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
	"github.com/resclass/resclass/pkg/inventory"
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

// Resclass returns the generated resclass.io clientset (admin), made once.
func (c *Cluster) Resclass() (versioned.Interface, error) {
	c.resclassOnce.Do(func() { c.resclass, c.resclassErr = versioned.NewForConfig(c.Config) })
	return c.resclass, c.resclassErr
}

// PublishNodeDevices writes the NodeDevices of a node as the node agent does
// (pkg/inventory): the object named after the node and owned by it (so it goes
// away with the node), then its status.
func (c *Cluster) PublishNodeDevices(ctx context.Context, nodeName string, status v1alpha1.NodeDevicesStatus) error {
	node, err := c.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	return c.publishNodeDevices(ctx, node, status)
}

func (c *Cluster) publishNodeDevices(ctx context.Context, node *corev1.Node, status v1alpha1.NodeDevicesStatus) error {
	rc, err := c.Resclass()
	if err != nil {
		return err
	}
	// The node agent's own publisher, so simulated nodes' inventories are
	// written exactly as real ones are.
	pub := &inventory.Publisher{Resclass: rc, Kube: c.Client, Node: node}
	_, err = pub.Publish(ctx, nil, status)
	return err
}

// NodeAgentServiceAccount is the node agent's identity in deploy/node-agent,
// in its own namespace resclass-node.
const NodeAgentServiceAccount = "system:serviceaccount:resclass-node:resclass-node-agent"

// NodeAgentConfig is a client configuration with the node agent's identity as
// deploy/node-agent gives it: its ServiceAccount, with a token bound to a pod on
// node (the node-name claim the apiserver adds). node "" is a token without
// the claim.
func (c *Cluster) NodeAgentConfig(node string) *rest.Config {
	cfg := rest.CopyConfig(c.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: NodeAgentServiceAccount,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:resclass-node", "system:authenticated"},
	}
	if node != "" {
		cfg.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {node}}
	}
	return cfg
}
