// Package kubeclient builds the API clients of a resclass process that runs on
// a node (the node agent, the MPS control supervisor): from a kubeconfig file,
// or in the cluster from the pod's ServiceAccount when none is named.
package kubeclient

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/resclass/resclass/pkg/client/clientset/versioned"
)

// New returns the resclass and Kubernetes clients for kubeconfig ("" for
// the in-cluster configuration), each request carrying userAgent, so that
// the apiserver's audit log and metrics tell the node's processes apart.
func New(kubeconfig, userAgent string) (versioned.Interface, kubernetes.Interface, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	config, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, nil, fmt.Errorf("client configuration: %w", err)
	}
	config.UserAgent = userAgent
	resclass, err := versioned.NewForConfig(config)
	if err != nil {
		return nil, nil, err
	}
	kube, err := kubernetes.NewForConfig(config)
	if err != nil {
		return nil, nil, err
	}
	return resclass, kube, nil
}
