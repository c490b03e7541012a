// Package kubectlplugin is the kubectl plugin "kubectl resclass": which
// devices a class selects and why not, what every class has free, why a pod is
// Pending, and what a class not yet created would select. It answers with the
// scheduler plugin's own decision code (resourceclasses.Snapshot) over what
// the user may read: ResourceClasses, NodeDevices, pods and Events.
package kubectlplugin

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
	"github.com/resclass/resclass/pkg/scheduler/resourceclasses"
)

// options are what every subcommand shares: the kubeconfig flags kubectl
// passes on (--kubeconfig, --context, -n, --as, ...) and the output format.
type options struct {
	streams genericiooptions.IOStreams
	config  *genericclioptions.ConfigFlags
	output  string
}

// NewCommand is "kubectl resclass" and its subcommands.
func NewCommand(streams genericiooptions.IOStreams) *cobra.Command {
	o := &options{streams: streams, config: genericclioptions.NewConfigFlags(true)}
	cmd := &cobra.Command{
		Use:   "kubectl-resclass",
		Short: "Ask the cluster what the resclass scheduler decides",
		Long: `kubectl resclass answers an operator's questions about resource classes with
the scheduler plugin's own decision code, run over what the cluster publishes:

  explain CLASS [--node NODE]   per node: the devices CLASS selects, healthy, free,
                                and for every device it does not select, why
  capacity [--nodes]            every class: allocatable, held, free (per node)
  why-pending POD               the pod's class requests against every node, in the
                                scheduler's words, and the pod's Events
  preview -f class.yaml         what a class not yet created would select
  mig [--node NODE]             every GPU in MIG mode: its instances, what could
                                still be created

It reads ResourceClasses, NodeDevices and pods of every namespace, and Events
(and Nodes, when allowed) with the kubeconfig kubectl uses; the view ClusterRole,
bound cluster-wide, is enough (resclass aggregates its kinds into view). It
writes nothing. Install it by copying the kubectl-resclass binary onto the PATH.`,
		Annotations:  map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl resclass"},
		SilenceUsage: true,
		Args:         cobra.NoArgs,
		RunE:         func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	o.config.AddFlags(cmd.PersistentFlags())
	cmd.PersistentFlags().StringVarP(&o.output, "output", "o", "", "Output format: empty for tables, json or yaml.")
	cmd.AddCommand(o.explainCommand(), o.capacityCommand(), o.whyPendingCommand(), o.previewCommand(), o.migCommand())
	return cmd
}

// clients are the typed clients of the user's kubeconfig.
type clients struct {
	kube     kubernetes.Interface
	resclass versioned.Interface
}

func (o *options) clients() (*clients, error) {
	cfg, err := o.config.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	// Custom resources speak JSON only.
	rcfg := rest.CopyConfig(cfg)
	rcfg.ContentType, rcfg.AcceptContentTypes = runtime.ContentTypeJSON, runtime.ContentTypeJSON
	rc, err := versioned.NewForConfig(rcfg)
	if err != nil {
		return nil, err
	}
	return &clients{kube: kube, resclass: rc}, nil
}

// world is what the scheduler's cache is built from.
type world struct {
	classes []v1alpha1.ResourceClass
	nodes   []v1alpha1.NodeDevices
	pods    []corev1.Pod
}

// load lists what the scheduler's cache holds. Listing is paged (500 at a
// time), as kubectl get does, so a large cluster is not one response.
func (c *clients) load(ctx context.Context) (*world, error) {
	var w world
	var err error
	rc := c.resclass.ResclassV1alpha1()
	if w.classes, err = listAll(ctx, "resourceclasses.resclass.io", func(ctx context.Context, o metav1.ListOptions) ([]v1alpha1.ResourceClass, string, error) {
		l, err := rc.ResourceClasses().List(ctx, o)
		if err != nil {
			return nil, "", err
		}
		return l.Items, l.Continue, nil
	}); err != nil {
		return nil, err
	}
	if w.nodes, err = c.nodeDevices(ctx); err != nil {
		return nil, err
	}
	if w.pods, err = listAll(ctx, "pods (all namespaces: the devices they hold)", func(ctx context.Context, o metav1.ListOptions) ([]corev1.Pod, string, error) {
		l, err := c.kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, o)
		if err != nil {
			return nil, "", err
		}
		return l.Items, l.Continue, nil
	}); err != nil {
		return nil, err
	}
	return &w, nil
}

// nodeDevices lists every NodeDevices, paged.
func (c *clients) nodeDevices(ctx context.Context) ([]v1alpha1.NodeDevices, error) {
	return listAll(ctx, "nodedevices.resclass.io", func(ctx context.Context, o metav1.ListOptions) ([]v1alpha1.NodeDevices, string, error) {
		l, err := c.resclass.ResclassV1alpha1().NodeDevices().List(ctx, o)
		if err != nil {
			return nil, "", err
		}
		return l.Items, l.Continue, nil
	})
}

// listAll pages through one list, what naming it in errors.
func listAll[T any](ctx context.Context, what string, list func(context.Context, metav1.ListOptions) ([]T, string, error)) ([]T, error) {
	var all []T
	opts := metav1.ListOptions{Limit: 500}
	for {
		items, next, err := list(ctx, opts)
		if err != nil {
			return nil, readError(what, err)
		}
		all = append(all, items...)
		if next == "" {
			return all, nil
		}
		opts.Continue = next
	}
}

// world connects and loads: what every subcommand but why-pending starts with.
func (o *options) world(ctx context.Context) (*world, error) {
	c, err := o.clients()
	if err != nil {
		return nil, err
	}
	return c.load(ctx)
}

func (w *world) snapshot() *resourceclasses.Snapshot {
	return resourceclasses.NewSnapshot(w.classes, w.nodes, w.pods)
}

// readError says which read right is missing.
func readError(what string, err error) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("listing %s: %w (kubectl resclass needs get/list on ResourceClasses, NodeDevices and pods cluster-wide: the view ClusterRole bound with a ClusterRoleBinding is enough)", what, err)
	}
	return fmt.Errorf("listing %s: %w", what, err)
}
