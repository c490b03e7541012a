// Package kubeletpods asks the kubelet which pods it knows, through its
// PodResources API (k8s.io/kubelet/pkg/apis/podresources/v1, served on
// /var/lib/kubelet/pod-resources/kubelet.sock).
//
// The kubelet adds a pod to its pod manager just before admitting it, and
// lists the active pods of its pod manager (the default since Kubernetes
// 1.34): during a device plugin's GetPreferredAllocation or Allocate, the pod
// being admitted is listed, and a pod bound to the node that the kubelet has
// not seen yet is not. The node agent's hand-off (pkg/handoff) asks when
// several pods wait for the same devices, to tell which one the kubelet is
// admitting (docs/node-agent.md, "The admission order").
//
// The answer crosses a trust boundary: it is read with a bounded message size,
// a bounded number of pods and bounded names, and refused otherwise.
package kubeletpods

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultSocket is where the kubelet serves the API (its default root dir).
const DefaultSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// Bounds of an answer.
const (
	// MaxPods is more than any kubelet runs (its maxPods is 110 by default,
	// a few hundred where raised).
	MaxPods = 5000
	// maxMessage is the most the client reads of one answer: the kubelet's
	// own limit on what it sends (16 MiB).
	maxMessage = 16 << 20
)

// Pods are the pods the kubelet knows, by namespace and name.
type Pods map[types.NamespacedName]bool

// Client asks one kubelet.
type Client struct {
	conn    *grpc.ClientConn
	lister  podresourcesv1.PodResourcesListerClient
	timeout time.Duration
}

// New returns a client of the API at socket; it connects at the first call,
// and again after the kubelet restarts. Every call gives up after timeout.
func New(socket string, timeout time.Duration) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage)))
	if err != nil {
		return nil, fmt.Errorf("kubelet PodResources API at %s: %w", socket, err)
	}
	return &Client{conn: conn, lister: podresourcesv1.NewPodResourcesListerClient(conn), timeout: timeout}, nil
}

// Known lists the pods the kubelet knows: those it admitted that are still
// active, and the one it is admitting.
func (c *Client) Known(ctx context.Context) (Pods, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.lister.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("kubelet PodResources List: %w", err)
	}
	return Parse(resp)
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Parse reads a List answer: every pod must have a valid namespace and name,
// and there may be at most MaxPods.
func Parse(resp *podresourcesv1.ListPodResourcesResponse) (Pods, error) {
	list := resp.GetPodResources()
	if len(list) > MaxPods {
		return nil, fmt.Errorf("the kubelet lists %d pods, more than %d", len(list), MaxPods)
	}
	pods := make(Pods, len(list))
	for _, p := range list {
		ns, name := p.GetNamespace(), p.GetName()
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, fmt.Errorf("the kubelet lists a pod in namespace %.80q: %s", ns, errs[0])
		}
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return nil, fmt.Errorf("the kubelet lists pod %.80q: %s", name, errs[0])
		}
		pods[types.NamespacedName{Namespace: ns, Name: name}] = true
	}
	return pods, nil
}
