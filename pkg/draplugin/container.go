package draplugin

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/resclass/resclass/pkg/assignment"
)

// A container can get devices of this driver from several requests: two
// claims, or one claim of two requests (the claim the scheduler makes for
// limits of two classes). The kubelet hands it each request's CDI device, and
// a runtime applying CDI devices keeps the last value of a variable. So, as on
// the device-plugin path (pkg/handoff, EnvClassDevicesPrefix), the CDI device
// of every request a container uses names the devices of all of them: each
// kind's variables (NVIDIA_VISIBLE_DEVICES, RESCLASS_NIC_*) list every device
// of that kind of the container, RESCLASS_DEVICES_<CLASS> every device of
// the class, and RESCLASS_SHARE_* and the MPS limits the container's shares
// summed, whatever order they are applied in.
//
// A claim's CDI device is written once, when the kubelet first prepares the
// claim, and is what every container using the claim gets. So a request is
// merged only where that is exactly one set of requests: its claim is the
// pod's own (controlled by the one pod it is reserved for: a claim made from
// a template, or the scheduler's claim for extended resources), and every
// container of that pod using the request uses the same requests. A claim
// others may share (created on its own, referenced by name) names its own
// devices only (docs/dra.md, "Limits").

// requestRef is one request of a claim, by the claim's UID and the request's
// name (its top-level name: a container names a request, the allocation its
// subrequest, "<request>/<subrequest>").
type requestRef struct {
	claim   types.UID
	request string
}

// requestDevices are the devices of this driver a request was allocated on
// this node, and the ResourceClass they are of.
type requestDevices struct {
	class string
	ids   []string
	// shares are the shares of ids that serve shares (share.go), by id.
	shares map[string]assignment.Share
}

// containerSet is what prepare merges a request's edits over: the devices of
// every request the containers using it use. ok is false when the request
// names only its own devices (see above); why says why, for the log.
type containerSet struct {
	all     []string            // every device id, in request order
	byClass map[string][]string // class -> device ids
	// shares are the container's shares, one per share request, keyed
	// "<claim uid>/<request>", and their devices under the same keys: what
	// handoff.ShareEdits sums, as the device-plugin path sums a
	// container's share classes.
	shares       map[string]assignment.Share
	shareDevices map[string][]string
	ok           bool
	why          string
}

// prepareCall is what one PrepareResourceClaims call reads once: its claims
// by namespace/name, and the pods and other claims companions reads from the
// apiserver. The kubelet prepares a pod's claims of this driver in one call,
// and every request of every claim would otherwise read the same pod again.
type prepareCall struct {
	claims map[types.NamespacedName]*resourceapi.ResourceClaim
	pods   map[types.NamespacedName]*corev1.Pod
}

func newPrepareCall(claims []*resourceapi.ResourceClaim) *prepareCall {
	call := &prepareCall{claims: make(map[types.NamespacedName]*resourceapi.ResourceClaim, len(claims)), pods: map[types.NamespacedName]*corev1.Pod{}}
	for _, c := range claims {
		call.claims[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = c
	}
	return call
}

// companions works out the containerSet of request (a top-level name) of
// claim. A claim the pod uses that is not in call is read from the apiserver
// (and kept in call).
func (p *Plugin) companions(ctx context.Context, claim *resourceapi.ResourceClaim, request string, call *prepareCall) containerSet {
	if p.cfg.Client == nil {
		return containerSet{why: "no client"}
	}
	owner := metav1.GetControllerOfNoCopy(claim)
	if owner == nil || owner.Kind != "Pod" || owner.APIVersion != "v1" || len(claim.Status.ReservedFor) != 1 || claim.Status.ReservedFor[0].UID != owner.UID {
		return containerSet{why: "the claim is not one pod's own"}
	}
	podKey := types.NamespacedName{Namespace: claim.Namespace, Name: owner.Name}
	pod, read := call.pods[podKey]
	if !read {
		var err error
		if pod, err = p.cfg.Client.CoreV1().Pods(claim.Namespace).Get(ctx, owner.Name, metav1.GetOptions{}); err != nil {
			return containerSet{why: fmt.Sprintf("reading pod %s: %v", owner.Name, err)}
		}
		call.pods[podKey] = pod
	}
	if pod.UID != owner.UID {
		return containerSet{why: "the claim's pod is gone"}
	}
	// The pod's claims, read once: this call's, else the apiserver's (a
	// pod has few).
	cache := map[string]*resourceapi.ResourceClaim{}
	for key, c := range call.claims {
		if key.Namespace == pod.Namespace {
			cache[key.Name] = c
		}
	}
	var unread error
	get := func(name string) *resourceapi.ResourceClaim {
		if c, ok := cache[name]; ok || name == "" {
			return c
		}
		c, err := p.cfg.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			unread, c = fmt.Errorf("reading ResourceClaim %s/%s: %w", pod.Namespace, name, err), nil
		} else {
			call.claims[types.NamespacedName{Namespace: pod.Namespace, Name: name}] = c
		}
		cache[name] = c
		return c
	}
	var set []requestRef
	found := false
	for _, c := range allContainers(pod) {
		refs := containerRequests(pod, c, get)
		if !slices.Contains(refs, requestRef{claim.UID, request}) {
			continue
		}
		slices.SortFunc(refs, func(a, b requestRef) int {
			return strings.Compare(string(a.claim)+"/"+a.request, string(b.claim)+"/"+b.request)
		})
		if found && !slices.Equal(refs, set) {
			return containerSet{why: "the pod's containers use the request with different requests"}
		}
		set, found = refs, true
	}
	if !found {
		return containerSet{why: "no container of the pod uses the request"}
	}
	if unread != nil {
		return containerSet{why: unread.Error()}
	}
	byUID := map[types.UID]*resourceapi.ResourceClaim{}
	for _, c := range cache {
		if c != nil {
			byUID[c.UID] = c
		}
	}
	out := containerSet{byClass: map[string][]string{}, shares: map[string]assignment.Share{}, shareDevices: map[string][]string{}, ok: true}
	for _, ref := range set {
		d, err := p.requestDevices(byUID[ref.claim], ref.request)
		if err != nil {
			return containerSet{why: err.Error()}
		}
		out.all = append(out.all, d.ids...)
		if len(d.ids) > 0 {
			out.byClass[d.class] = append(out.byClass[d.class], d.ids...)
		}
		if len(d.shares) > 0 {
			if len(d.ids) != 1 {
				return containerSet{why: fmt.Sprintf("request %s of a claim of the pod has %d devices, some of them shares", ref.request, len(d.ids))}
			}
			key := string(ref.claim) + "/" + ref.request
			out.shares[key], out.shareDevices[key] = d.shares[d.ids[0]], d.ids
		}
	}
	return out
}

// requestDevices are the devices of this driver on this node of request (a
// top-level name) of claim, and their class.
func (p *Plugin) requestDevices(claim *resourceapi.ResourceClaim, request string) (requestDevices, error) {
	if claim == nil {
		return requestDevices{}, fmt.Errorf("a ResourceClaim of the pod cannot be read")
	}
	if claim.Status.Allocation == nil {
		return requestDevices{}, fmt.Errorf("ResourceClaim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	var out requestDevices
	for _, r := range claim.Status.Allocation.Devices.Results {
		if parent, _, _ := strings.Cut(r.Request, "/"); parent != request || r.Driver != p.cfg.DriverName {
			continue
		}
		id, ok := p.ids[r.Device]
		if r.Pool != p.cfg.NodeName || !ok {
			return requestDevices{}, fmt.Errorf("ResourceClaim %s/%s: device %s/%s is not on this node", claim.Namespace, claim.Name, r.Pool, r.Device)
		}
		share, err := readShare(&r, p.devices[id])
		if err != nil {
			return requestDevices{}, fmt.Errorf("ResourceClaim %s/%s: %w", claim.Namespace, claim.Name, err)
		}
		if share != nil {
			if out.shares == nil {
				out.shares = map[string]assignment.Share{}
			}
			out.shares[id] = share
		}
		out.ids = append(out.ids, id)
		out.class = p.cfg.ClassOf(deviceClassOf(claim, r.Request))
	}
	return out, nil
}

// allContainers are the pod's init and regular containers (an ephemeral
// container cannot use claims).
func allContainers(pod *corev1.Pod) []*corev1.Container {
	out := make([]*corev1.Container, 0, len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
	for i := range pod.Spec.InitContainers {
		out = append(out, &pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		out = append(out, &pod.Spec.Containers[i])
	}
	return out
}

// podClaimName is the ResourceClaim the pod's claim entry name stands for;
// "" when it is not known (yet).
func podClaimName(pod *corev1.Pod, entry string) string {
	for _, pc := range pod.Spec.ResourceClaims {
		if pc.Name != entry {
			continue
		}
		if pc.ResourceClaimName != nil {
			return *pc.ResourceClaimName
		}
		for _, st := range pod.Status.ResourceClaimStatuses {
			if st.Name == entry && st.ResourceClaimName != nil {
				return *st.ResourceClaimName
			}
		}
	}
	return ""
}

// containerRequests are the requests of this driver's claims container c of
// the pod uses: its resources.claims (a whole claim is each of its requests)
// and its extended resources backed by DRA. get returns a claim of the pod's
// namespace by name, nil when it cannot be read: its requests are left out.
// Requests with no device of this driver are kept (they add no device).
func containerRequests(pod *corev1.Pod, c *corev1.Container, get func(name string) *resourceapi.ResourceClaim) []requestRef {
	var out []requestRef
	add := func(ref requestRef) {
		if !slices.Contains(out, ref) {
			out = append(out, ref)
		}
	}
	for _, rc := range c.Resources.Claims {
		claim := get(podClaimName(pod, rc.Name))
		if claim == nil {
			continue
		}
		if rc.Request != "" {
			add(requestRef{claim.UID, rc.Request})
			continue
		}
		for _, r := range claim.Spec.Devices.Requests {
			add(requestRef{claim.UID, r.Name})
		}
	}
	if st := pod.Status.ExtendedResourceClaimStatus; st != nil {
		var claim *resourceapi.ResourceClaim
		for _, m := range st.RequestMappings {
			if m.ContainerName != c.Name {
				continue
			}
			if claim == nil {
				if claim = get(st.ResourceClaimName); claim == nil {
					break
				}
			}
			add(requestRef{claim.UID, m.RequestName})
		}
	}
	return out
}
