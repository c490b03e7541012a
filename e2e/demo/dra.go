package main

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/e2e/framework/cri"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/assignment"
	"github.com/resclass/resclass/pkg/discovery/nvml/nvmlmock"
	"github.com/resclass/resclass/pkg/dra/dradevice"
	"github.com/resclass/resclass/pkg/draplugin"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// draNode is the demo's DRA-mode node: a real kubelet and the real node agent
// on go-nvml's DGX A100 mock, labelled for DRA (docs/dra.md, "Nodes").
const draNode = "dra-node"

// draClass is the example class the DRA section asks for on both forms.
const draClass = "nvidia.high.mem"

// draSetup is what the DRA section started: its node, where the agent writes
// the claims' CDI specs, and how to stop the agent (before the cluster stops).
type draSetup struct {
	kn     *framework.KubeletNode
	dgx    *nvmlmock.Server
	gpus   int
	cdiDir string
	stop   func()
}

// startDRANode starts the stock resclass-dra scheduler (if the cluster does
// not run it yet), a kubelet node labelled node.resclass.io/device-mode=dra
// and the node agent on it, which sees the label and serves DRA: ResourceSlices
// and a kubelet plugin, no device-plugin endpoint. The agent's RBAC is
// deploy/node-agent/rbac.yaml, applied by startNodeAgent.
func startDRANode(ctx context.Context, c *framework.Cluster) (*draSetup, error) {
	if !c.DRASchedulerStarted() {
		if err := c.StartDRAScheduler(ctx); err != nil {
			return nil, err
		}
	}
	kn, err := c.AddKubeletNode(ctx, framework.NodeOptions{Name: draNode, Labels: map[string]string{v1alpha1.LabelDeviceMode: v1alpha1.DeviceModeDRA}})
	if err != nil {
		return nil, err
	}
	// The kubelet's --root-dir, where it watches plugins_registry.
	kubeletDir := filepath.Join(kn.Dir, "root")
	dgx, stop, err := runMockAgent(ctx, c, kn, func(cfg *nodeagent.Config) {
		cfg.DRA = nodeagent.DRAConfig{
			PluginDataDir:   filepath.Join(kubeletDir, "plugins", dradevice.DriverName),
			RegistrationDir: filepath.Join(kubeletDir, "plugins_registry"),
		}
	})
	if err != nil {
		return nil, err
	}
	return &draSetup{kn: kn, dgx: dgx, gpus: len(dgx.UUIDs()), cdiDir: filepath.Join(c.Dir, kn.Name+"-cdi"), stop: stop}, nil
}

// draNodeSection shows the same example class served on the DRA node: the
// DeviceClass the resclass scheduler keeps for it, the node's ResourceSlice,
// one pod in the extended-resource form and one with a ResourceClaim, both
// placed by the stock resclass-dra profile, and what each container got.
func draNodeSection(ctx context.Context, p *printer, c *framework.Cluster, d *draSetup) error {
	p.line("  Node %s is labelled %s=%s. Its node agent (the same code as", draNode, v1alpha1.LabelDeviceMode, v1alpha1.DeviceModeDRA)
	p.line("  %s's, on another go-nvml DGX A100 mock) sees the label and serves DRA: it publishes", agentNode)
	p.line("  its GPUs in ResourceSlices and runs a DRA kubelet plugin, no device-plugin endpoint.")
	p.line("  The pods below name the stock kube-scheduler profile %s (deploy/scheduler/dra/", framework.DRASchedulerName)
	p.line("  config.yaml: upstream's plugins, DRAExtendedResource on, DRA-mode nodes only), which")
	p.line("  runs beside the resclass scheduler.")

	var dc *resourceapi.DeviceClass
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		dc, err = c.Client.ResourceV1().DeviceClasses().Get(ctx, draClass, metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("the scheduler never created the DeviceClass of %s: %w", draClass, err)
	}
	if dc.Spec.ExtendedResourceName == nil || len(dc.Spec.Selectors) != 1 || dc.Spec.Selectors[0].CEL == nil {
		return fmt.Errorf("DeviceClass %s is %+v: want one CEL selector and an extended resource", draClass, dc.Spec)
	}
	p.line("  The resclass scheduler keeps one DeviceClass per ResourceClass, whose CEL selects the")
	p.line("  devices the class selects (kubectl get deviceclass %s -o yaml):", draClass)
	p.line("    metadata: {name: %s}", dc.Name)
	p.line("    spec:")
	p.line("      extendedResourceName: %s", *dc.Spec.ExtendedResourceName)
	p.line("      selectors:")
	p.line("      - cel: {expression: '%s'}", dc.Spec.Selectors[0].CEL.Expression)

	var list []resourceapi.ResourceSlice
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		list, err = draNodeSlices(ctx, c)
		return len(dradevice.IDs(list)) == d.gpus, err
	})
	if err != nil {
		return fmt.Errorf("%s's ResourceSlices never listed its %d GPUs: %w", draNode, d.gpus, err)
	}
	p.line("  The node's ResourceSlices (kubectl get resourceslices --field-selector spec.nodeName=%s):", draNode)
	for _, s := range list {
		p.line("    %s: driver %s, pool %s, %d devices", s.Name, s.Spec.Driver, s.Spec.Pool.Name, len(s.Spec.Devices))
	}
	first := list[0].Spec.Devices[0]
	p.line("  one device, briefly:")
	p.line("    - name: %s", first.Name)
	var attrs []string
	for _, k := range slices.Sorted(maps.Keys(first.Attributes)) {
		if v := attrString(first.Attributes[k]); v != "" && (k == dradevice.AttributeID || k == dradevice.AttributeKind || k == "product") {
			attrs = append(attrs, string(k)+": "+v)
		}
	}
	p.line("      attributes: {%s, ... %d in all}", strings.Join(attrs, ", "), len(first.Attributes))
	var caps []string
	for _, k := range slices.Sorted(maps.Keys(first.Capacity)) {
		q := first.Capacity[k].Value
		caps = append(caps, string(k)+": "+q.String())
	}
	p.line("      capacity: {%s}", strings.Join(caps, ", "))

	// Both pods name the stock profile; the profile's own node affinity
	// confines them to DRA-mode nodes, so neither pins a node.
	ext := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "dra-ext", Namespace: "demo"},
		Spec: corev1.PodSpec{SchedulerName: framework.DRASchedulerName, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "train", Image: "registry.example/train:1",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceNamePrefix + draClass: resource.MustParse("1")}},
			}}},
	}
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "two-gpus", Namespace: "demo"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name:    "gpus",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: draClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2},
		}}}}},
	}
	claimed := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "dra-claim", Namespace: "demo"},
		Spec: corev1.PodSpec{SchedulerName: framework.DRASchedulerName, RestartPolicy: corev1.RestartPolicyNever,
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: &tmpl.Name}},
			Containers: []corev1.Container{{
				Name: "train", Image: "registry.example/train:1",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}},
			}}},
	}
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates("demo").Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		return err
	}
	for _, pod := range []*corev1.Pod{ext, claimed} {
		if _, err := c.Client.CoreV1().Pods("demo").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err
		}
	}

	p.line("  demo/dra-ext asks in the extended-resource form, as train-2 did in section 7:")
	p.line("  class.resclass.io/%s: 1, with schedulerName: %s. The stock", draClass, framework.DRASchedulerName)
	p.line("  DynamicResources plugin makes its claim from the DeviceClass of that")
	p.line("  extendedResourceName and allocates it:")
	if err := draPodResult(ctx, p, c, d, list, "dra-ext", func(pod *corev1.Pod) string {
		if st := pod.Status.ExtendedResourceClaimStatus; st != nil {
			return st.ResourceClaimName
		}
		return ""
	}); err != nil {
		return err
	}
	p.line("  demo/dra-claim asks with a ResourceClaimTemplate (request gpus: deviceClassName")
	p.line("  %s, count 2), also with schedulerName: %s; kube-controller-manager", draClass, framework.DRASchedulerName)
	p.line("  makes its claim from the template and the stock profile allocates it:")
	if err := draPodResult(ctx, p, c, d, list, "dra-claim", func(pod *corev1.Pod) string {
		for _, s := range pod.Status.ResourceClaimStatuses {
			if s.Name == "gpus" && s.ResourceClaimName != nil {
				return *s.ResourceClaimName
			}
		}
		return ""
	}); err != nil {
		return err
	}
	p.line("  The same GPU CDI names and variable as on %s (section 7). Neither pod has a", agentNode)
	p.line("  resclass.io/assignment: on a DRA node the claim's allocation says which GPUs a pod holds.")
	return nil
}

// draPodResult waits for pod's container on the DRA node, then prints where it
// runs, its claim's allocation and what the container received: the CDI
// devices the kubelet passed to the runtime and the environment the claim's
// CDI device gives (applied by the CDI library, as containerd and CRI-O do).
func draPodResult(ctx context.Context, p *printer, c *framework.Cluster, d *draSetup, list []resourceapi.ResourceSlice, name string, claimOf func(*corev1.Pod) string) error {
	rec, err := d.kn.WaitForRecord(ctx, "demo", name, "train")
	if err != nil {
		return err
	}
	var pod *corev1.Pod
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pod, err = c.Client.CoreV1().Pods("demo").Get(ctx, name, metav1.GetOptions{})
		return err == nil && pod.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		return fmt.Errorf("demo/%s never Running: %w", name, err)
	}
	if pod.Spec.NodeName != draNode {
		return fmt.Errorf("demo/%s runs on %s, want %s", name, pod.Spec.NodeName, draNode)
	}
	if _, found, _ := assignment.FromPod(pod); found {
		return fmt.Errorf("demo/%s carries a resclass assignment on a DRA node", name)
	}
	claimName := claimOf(pod)
	if claimName == "" {
		return fmt.Errorf("demo/%s's status names no claim", name)
	}
	claim, err := c.Client.ResourceV1().ResourceClaims("demo").Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if claim.Status.Allocation == nil {
		return fmt.Errorf("claim demo/%s is not allocated", claimName)
	}
	allocated := allocatedIDs(claim, list)
	gpus := "GPUs"
	if len(allocated) == 1 {
		gpus = "GPU"
	}
	p.line("    %s on %s; claim %s: %d %s, %s", pod.Status.Phase, pod.Spec.NodeName, claimName, len(allocated), gpus, shortList(allocated))
	env, err := claimEnv(d.cdiDir, rec)
	if err != nil {
		return fmt.Errorf("demo/%s: %w", name, err)
	}
	want := slices.Sorted(slices.Values(allocated))
	if got := strings.Split(env[handoff.ClassEnv(draClass)], ","); !slices.Equal(slices.Sorted(slices.Values(got)), want) {
		return fmt.Errorf("demo/%s: %s=%v, the claim allocated %v", name, handoff.ClassEnv(draClass), got, allocated)
	}
	p.line("    the kubelet had the runtime create container \"train\" with the CDI devices")
	for _, dev := range rec.CDIDevices {
		p.line("      %s", dev.GetName())
	}
	p.line("    and the claim's CDI device (its spec written by the agent's DRA plugin) sets")
	for _, k := range slices.Sorted(maps.Keys(env)) {
		p.line("      %s=%s", k, env[k])
	}
	return nil
}

// draNodeSlices are the ResourceSlices of the DRA node.
func draNodeSlices(ctx context.Context, c *framework.Cluster) ([]resourceapi.ResourceSlice, error) {
	l, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, draNode).String()})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// allocatedIDs are the resclass ids of the devices of driver resclass.io
// the allocated claim was given, as list publishes them.
func allocatedIDs(claim *resourceapi.ResourceClaim, list []resourceapi.ResourceSlice) []string {
	byName := map[string]string{}
	for id, n := range dradevice.IDs(list) {
		byName[n] = id
	}
	var out []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == dradevice.DriverName {
			out = append(out, byName[r.Device])
		}
	}
	return out
}

// claimEnv is the environment the claim CDI devices of rec give the
// container, injected in the order the kubelet sent them by the CDI library.
func claimEnv(dir string, rec cri.Record) (map[string]string, error) {
	var names []string
	for _, d := range rec.CDIDevices {
		if strings.HasPrefix(d.GetName(), draplugin.CDIKind+"=") {
			names = append(names, d.GetName())
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("the runtime got no %s CDI device: %v", draplugin.CDIKind, rec.CDIDevices)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, err
	}
	spec := &oci.Spec{Process: &oci.Process{}}
	if unresolved, err := cache.InjectDevices(spec, names...); err != nil {
		return nil, fmt.Errorf("the runtime would refuse the container: %w (unresolved %v)", err, unresolved)
	}
	out := map[string]string{}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out, nil
}

func attrString(a resourceapi.DeviceAttribute) string {
	switch {
	case a.StringValue != nil:
		return *a.StringValue
	case a.IntValue != nil:
		return fmt.Sprint(*a.IntValue)
	case a.BoolValue != nil:
		return fmt.Sprint(*a.BoolValue)
	case a.VersionValue != nil:
		return *a.VersionValue
	}
	return ""
}

func shortList(ids []string) string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = short(id)
	}
	return strings.Join(out, ", ")
}
