package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/resclass/resclass/deploy/install"
	deploynodeagent "github.com/resclass/resclass/deploy/node-agent"
	"github.com/resclass/resclass/pkg/devicekind/kinds"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu"
	"github.com/resclass/resclass/pkg/devicekind/nvidiagpu/nvmlsource"
	"github.com/resclass/resclass/pkg/discovery/nvml"
	"github.com/resclass/resclass/pkg/handoff"
	"github.com/resclass/resclass/pkg/nodeagent"
)

// gpuIsolationDenial starts every refusal of resclass-gpu-isolation.
const gpuIsolationDenial = "GPUs are assigned by the resclass scheduler, not chosen by a pod"

// wantGPUIsolationDenial checks that err is resclass-gpu-isolation's refusal
// and that it names each of names.
func wantGPUIsolationDenial(t *testing.T, what string, err error, names ...string) {
	t.Helper()
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), gpuIsolationDenial) || !strings.Contains(err.Error(), "resclass-gpu-isolation") {
		t.Errorf("%s: %v, want Forbidden by resclass-gpu-isolation", what, err)
		return
	}
	for _, n := range names {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("%s: the refusal does not name %s: %v", what, n, err)
		}
	}
}

// plainPod is a pod of one container "c" without a class request on node:
// what a tenant writes to reach the node's GPUs around the scheduler.
func plainPod(ns, name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptrTo(int64(0)),
			NodeSelector: map[string]string{corev1.LabelHostname: node},
			Containers:   []corev1.Container{{Name: "c", Image: "registry.example/train:1"}},
		},
	}
}

// TestGPUIsolationPolicy: with the policy deploy/node-agent installs (the
// harness applies it with every cluster), a tenant holding every right on
// pods in its namespace cannot name GPUs to the runtime itself, by variable
// or annotation, at create, on update, in an ephemeral container, by a status
// update or in a Binding; values that select no device, class pods, the
// node agent's own pod and the allow-listed namespace and ServiceAccount are
// admitted.
func TestGPUIsolationPolicy(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	const class = "e2e-gpuiso-gpu"
	node, _, ns, tc := tenantOnGPUNode(t, ctx, "gpuiso-dgx", class)
	// The tenant may add ephemeral containers too (kubectl debug).
	grant(t, ctx, "e2e-tenant-"+ns, ns, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/ephemeralcontainers"}, Verbs: []string{"update", "patch"}})
	create := func(c kubernetes.Interface, pod *corev1.Pod) error {
		_, err := c.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		return err
	}
	env := func(name, value string) corev1.EnvVar { return corev1.EnvVar{Name: name, Value: value} }

	// The policy as shipped is what the harness installed.
	all := plainPod(ns, "all", node)
	all.Spec.Containers[0].Env = []corev1.EnvVar{env("NVIDIA_VISIBLE_DEVICES", "all")}
	err := create(tc, all)
	wantGPUIsolationDenial(t, "a tenant's pod with NVIDIA_VISIBLE_DEVICES=all", err, "container c sets NVIDIA_VISIBLE_DEVICES")
	t.Logf("the refusal: %v", err)

	// Each variable, in each kind of container, and each way of setting it.
	for what, mutate := range map[string]func(p *corev1.Pod){
		"a GPU by UUID": func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{env("NVIDIA_VISIBLE_DEVICES", "GPU-0b4c0fe1-0000-0000-0000-000000000000")}
		},
		"an index, in an init container": func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "registry.example/init:1", Env: []corev1.EnvVar{env("NVIDIA_VISIBLE_DEVICES", "0")}}}
		},
		"a value from a ConfigMap": func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", ValueFrom: &corev1.EnvVarSource{
				ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "gpus"}, Key: "all"}}}}
		},
		"a reference to another variable": func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{env("GPUS", "all"), env("NVIDIA_VISIBLE_DEVICES", "$(GPUS)")}
		},
		"void after all, in a second entry": func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{env("NVIDIA_VISIBLE_DEVICES", "void"), env("NVIDIA_VISIBLE_DEVICES", "all")}
		},
		"MIG configuration": func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{env("NVIDIA_MIG_CONFIG_DEVICES", "all")}
		},
		"MIG monitoring": func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{env("NVIDIA_MIG_MONITOR_DEVICES", "all")}
		},
		"IMEX channels": func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{env("NVIDIA_IMEX_CHANNELS", "0")}
		},
	} {
		p := plainPod(ns, "selects", node)
		mutate(p)
		var name string
		for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
			for _, e := range c.Env {
				if strings.HasPrefix(e.Name, "NVIDIA_") {
					name = "container " + c.Name + " sets " + e.Name
				}
			}
		}
		wantGPUIsolationDenial(t, "a tenant's pod with "+what, create(tc, p), name)
	}
	// Even the cluster admin: the policy is about the pod, not who writes it.
	wantGPUIsolationDenial(t, "the admin's pod with NVIDIA_VISIBLE_DEVICES=all", create(cluster.Client, all), "NVIDIA_VISIBLE_DEVICES")

	// A CDI request in a pod annotation, at create.
	annotated := plainPod(ns, "annotated", node)
	annotated.Annotations = map[string]string{"cdi.k8s.io/gpus": "nvidia.com/gpu=all"}
	wantGPUIsolationDenial(t, "a tenant's pod with a cdi.k8s.io/ annotation", create(tc, annotated), "cdi.k8s.io/gpus")

	// Admitted: values that select no device, variables that select none,
	// and a class pod, which the scheduler binds as usual.
	quiet := plainPod(ns, "quiet", node)
	quiet.Spec.Containers[0].Env = []corev1.EnvVar{
		env("NVIDIA_VISIBLE_DEVICES", "void"), env("NVIDIA_DRIVER_CAPABILITIES", "all"), env("NVIDIA_MIG_CONFIG_DEVICES", ""),
		env("NVIDIA_REQUIRE_CUDA", "cuda>=12.0"), env("MY_NVIDIA_VISIBLE_DEVICES", "all"),
	}
	quiet.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "registry.example/init:1", Env: []corev1.EnvVar{env("NVIDIA_VISIBLE_DEVICES", "none")}}}
	quiet.Annotations = map[string]string{"example.com/cdi.k8s.io": "not a CDI key"}
	if err := create(tc, quiet); err != nil {
		t.Errorf("a pod whose NVIDIA_ variables select no device: %v", err)
	}
	if err := create(tc, gpuPodOn(ns, "classy", resclassScheduler, node, class, 2)); err != nil {
		t.Fatalf("a class pod: %v", err)
	}
	boundAssignment(t, ctx, ns, "classy")

	// On update: adding or changing a cdi.k8s.io/ annotation; other
	// annotations stay the tenant's.
	wantGPUIsolationDenial(t, "a tenant annotating its pod cdi.k8s.io/", annotate(ctx, tc, ns, "classy", map[string]any{"cdi.k8s.io/more": "nvidia.com/gpu=all"}), "cdi.k8s.io/more")
	if err := annotate(ctx, tc, ns, "classy", map[string]any{"example.com/note": "mine"}); err != nil {
		t.Errorf("a tenant's own annotation: %v", err)
	}
	// By a status update (its strategy keeps metadata changes), even the
	// admin's.
	pod, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "classy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Annotations["cdi.k8s.io/status"] = "nvidia.com/gpu=all"
	_, err = cluster.Client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	wantGPUIsolationDenial(t, "a cdi.k8s.io/ annotation by a status update", err, "cdi.k8s.io/status")

	// In an ephemeral container (kubectl debug) of a running class pod.
	pod, err = cluster.Client.CoreV1().Pods(ns).Get(ctx, "classy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Spec.EphemeralContainers = append(pod.Spec.EphemeralContainers, corev1.EphemeralContainer{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
		Name: "debug", Image: "registry.example/debug:1", Env: []corev1.EnvVar{env("NVIDIA_VISIBLE_DEVICES", "all")},
	}})
	_, err = tc.CoreV1().Pods(ns).UpdateEphemeralContainers(ctx, "classy", pod, metav1.UpdateOptions{})
	wantGPUIsolationDenial(t, "an ephemeral container with NVIDIA_VISIBLE_DEVICES=all", err, "container debug sets NVIDIA_VISIBLE_DEVICES")
	pod.Spec.EphemeralContainers[len(pod.Spec.EphemeralContainers)-1].Env = nil
	if _, err := tc.CoreV1().Pods(ns).UpdateEphemeralContainers(ctx, "classy", pod, metav1.UpdateOptions{}); err != nil {
		t.Errorf("an ephemeral container without the variable: %v", err)
	}

	// In a Binding, whose annotations the apiserver merges into the pod:
	// pods/binding and the legacy bindings resource alike.
	unbound := plainPod(ns, "unbound", node)
	unbound.Spec.SchedulerName, unbound.Spec.NodeSelector = "e2e-bound-by-test", nil
	created, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, unbound, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: created.Name, UID: created.UID, Annotations: map[string]string{"cdi.k8s.io/bound": "nvidia.com/gpu=all"}},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}
	wantGPUIsolationDenial(t, "a Binding (pods/binding) with a cdi.k8s.io/ annotation", cluster.Client.CoreV1().Pods(ns).Bind(ctx, binding, metav1.CreateOptions{}), "cdi.k8s.io/bound")
	err = cluster.Client.CoreV1().RESTClient().Post().Namespace(ns).Resource("bindings").Body(binding).Do(ctx).Error()
	wantGPUIsolationDenial(t, "a Binding (bindings) with a cdi.k8s.io/ annotation", err, "cdi.k8s.io/bound")

	// The allow-listed namespace, the node agent's own: what it runs may
	// set the variable (the Helm chart's nodeAgent.privileged=false does).
	if _, err := cluster.ApplyManifest(ctx, "../deploy/node-agent/rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	inAgentNS := all.DeepCopy()
	inAgentNS.Namespace = install.NodeAgentNamespace
	if _, err := cluster.Client.CoreV1().Pods(inAgentNS.Namespace).Create(ctx, inAgentNS, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=all in the allow-listed %s: %v", inAgentNS.Namespace, err)
	}
	// The node agent's own pod, as both renders ship it, carries none of it:
	// admitted even outside the allow-list.
	objs, err := install.Kustomize()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "DaemonSet" || o.GetName() != "resclass-node-agent" {
			continue
		}
		agent := podOfTemplate(t, o)
		for _, namespace := range []string{install.NodeAgentNamespace, ns} {
			agent.Namespace = namespace
			if namespace != install.NodeAgentNamespace {
				// Its ServiceAccount lives in its own namespace only.
				agent.Spec.ServiceAccountName = ""
			}
			if _, err := cluster.Client.CoreV1().Pods(namespace).Create(ctx, agent, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
				t.Errorf("the node agent's pod in %s: %v", namespace, err)
			}
		}
	}

	// A ServiceAccount on the allow-list (the Helm chart's
	// allowedServiceAccounts, namespace:name): its pods may, the namespace's
	// others may not. The shipped policy is put back afterwards.
	withSA, err := install.HelmTemplate(ctx, map[string]any{"nodeAgent": map[string]any{"gpuIsolationPolicy": map[string]any{"allowedServiceAccounts": []string{ns + ":dcgm-exporter"}}}})
	if err != nil {
		t.Fatal(err)
	}
	var policy []byte
	for _, o := range withSA {
		if o.GetKind() == "ValidatingAdmissionPolicy" && o.GetName() == "resclass-gpu-isolation" {
			if policy, err = json.Marshal(o.Object); err != nil {
				t.Fatal(err)
			}
		}
	}
	if policy == nil {
		t.Fatal("the Helm chart renders no resclass-gpu-isolation")
	}
	t.Cleanup(func() {
		if _, err := cluster.ApplyManifestData(context.Background(), "deploy/node-agent/gpu-isolation-policy.yaml", deploynodeagent.GPUIsolationPolicy); err != nil {
			t.Errorf("putting the shipped policy back: %v", err)
		}
	})
	if _, err := cluster.ApplyManifestData(ctx, "helm gpuIsolationPolicy.allowedServiceAccounts", policy); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "dcgm-exporter"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	exporter := all.DeepCopy()
	exporter.Name, exporter.Spec.ServiceAccountName = "exporter", "dcgm-exporter"
	poll(t, ctx, time.Minute, "the allow-listed ServiceAccount's pod admitted", func(ctx context.Context) (bool, error) {
		_, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, exporter, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, nil
	})
	wantGPUIsolationDenial(t, "the default ServiceAccount's pod beside an allow-listed one", create(tc, all), "NVIDIA_VISIBLE_DEVICES")
}

// podOfTemplate is the pod a workload's template makes.
func podOfTemplate(t *testing.T, o *unstructured.Unstructured) *corev1.Pod {
	t.Helper()
	m, _, err := unstructured.NestedMap(o.Object, "spec", "template")
	if err != nil {
		t.Fatal(err)
	}
	var tmpl corev1.PodTemplateSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &tmpl); err != nil {
		t.Fatal(err)
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: o.GetName() + "-", Labels: tmpl.Labels}, Spec: tmpl.Spec}
}

// TestNodeAgentEventsPolicy: the agent's Events are fenced to what it is
// (resclass-node-agent-own-events in deploy/node-agent/rbac.yaml). A real
// agent's Event on its Node is written; as the agent's identity, Events that
// claim another reporter, concern another Node or another kind of object, or
// rewrite another component's Event are refused, in both Event APIs.
func TestNodeAgentEventsPolicy(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	if _, err := cluster.ApplyManifest(ctx, "../deploy/node-agent/rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	const nodeA, nodeB = "events-node-a", "events-node-b"
	arc, akc := robustNode(t, ctx, nodeA)
	robustNode(t, ctx, nodeB)

	// The agent itself, with the envvar strategy: the GPUsNotIsolated
	// Warning it records on its Node (reason EnvVarStrategy) goes through
	// the policy.
	dgx, root := mockDGX(t)
	runAgent(t, ctx, nodeagent.New(nodeagent.Config{
		NodeName: nodeA, HostRoot: root,
		Kinds:        kinds.Builtin.Configured(nvidiagpu.Kind{NVML: &nvmlsource.NVML{Binding: dgx, Health: nvml.HealthOptions{WaitTimeout: 100 * time.Millisecond}}}),
		PollInterval: 200 * time.Millisecond, ResyncInterval: time.Hour,
		DeviceListStrategies: handoff.Strategies{handoff.StrategyEnvVar},
	}, arc, akc))
	var own corev1.Event
	poll(t, ctx, time.Minute, "the agent's GPUsNotIsolated Event on its Node", func(ctx context.Context) (bool, error) {
		evs, err := cluster.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
			"involvedObject.kind": "Node", "involvedObject.name": nodeA, "reason": nodeagent.EventGPUsNotIsolated}.String()})
		if err != nil || len(evs.Items) == 0 {
			return false, err
		}
		own = evs.Items[0]
		return true, nil
	})
	if own.Type != corev1.EventTypeWarning || own.Source.Host != nodeA || own.ReportingInstance != nodeA {
		t.Errorf("the agent's Event: type %s, source %+v, reportingInstance %q, message %q", own.Type, own.Source, own.ReportingInstance, own.Message)
	}

	ac, err := kubernetes.NewForConfig(cluster.NodeAgentConfig(nodeA))
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, ctx, nil)
	now := metav1.Now()
	event := func(namespace, host string, about corev1.ObjectReference) *corev1.Event {
		return &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: "e2e-", Namespace: namespace},
			InvolvedObject: about, Reason: "E2EProbe", Message: "probe", Type: corev1.EventTypeNormal,
			Source: corev1.EventSource{Component: "resclass-node-agent", Host: host}, ReportingController: "resclass-node-agent", ReportingInstance: host,
			FirstTimestamp: now, LastTimestamp: now, Count: 1,
		}
	}
	nodeRef := func(name string) corev1.ObjectReference {
		return corev1.ObjectReference{Kind: "Node", Name: name, APIVersion: "v1"}
	}
	podRef := corev1.ObjectReference{Kind: "Pod", Name: "some-pod", Namespace: ns, APIVersion: "v1"}
	write := func(e *corev1.Event) error {
		_, err := ac.CoreV1().Events(e.Namespace).Create(ctx, e, metav1.CreateOptions{})
		return err
	}
	const asItself, aboutItsOwn = "may write Events only as itself", "may write Events only about its own Node"

	// Admitted: its Node; a pod or claim, in the object's namespace (what a
	// write cannot show is which node the pod is on: the residual risk).
	for what, e := range map[string]*corev1.Event{
		"about its Node":        event(metav1.NamespaceDefault, nodeA, nodeRef(nodeA)),
		"about a pod":           event(ns, nodeA, podRef),
		"about a ResourceClaim": event(ns, nodeA, corev1.ObjectReference{Kind: "ResourceClaim", Name: "claim", Namespace: ns, APIVersion: "resource.k8s.io/v1"}),
		"with reportingInstance only": func() *corev1.Event {
			e := event(metav1.NamespaceDefault, nodeA, nodeRef(nodeA))
			e.Source.Host = ""
			return e
		}(),
	} {
		if err := write(e); err != nil {
			t.Errorf("the agent writing an Event %s: %v", what, err)
		}
	}
	// Refused, naming why.
	for what, tc := range map[string]struct {
		e    *corev1.Event
		want string
	}{
		"about another Node":      {event(metav1.NamespaceDefault, nodeA, nodeRef(nodeB)), aboutItsOwn},
		"as another node's agent": {event(metav1.NamespaceDefault, nodeB, nodeRef(nodeA)), asItself},
		"without a reporter":      {event(metav1.NamespaceDefault, "", nodeRef(nodeA)), asItself},
		"with reporters that disagree": {func() *corev1.Event {
			e := event(metav1.NamespaceDefault, nodeA, nodeRef(nodeA))
			e.ReportingInstance = nodeB
			return e
		}(), asItself},
		"about a Secret":                   {event(ns, nodeA, corev1.ObjectReference{Kind: "Secret", Name: "s", Namespace: ns, APIVersion: "v1"}), aboutItsOwn},
		"about a Pod of another API group": {event(ns, nodeA, corev1.ObjectReference{Kind: "Pod", Name: "p", Namespace: ns, APIVersion: "evil.example/v1"}), aboutItsOwn},
	} {
		err := write(tc.e)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "resclass-node-agent-own-events") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("the agent writing an Event %s: %v, want Forbidden by resclass-node-agent-own-events: %s", what, err, tc.want)
		}
	}
	// An Event in another namespace than its object's: the apiserver's own
	// validation refuses it before admission (the policy checks it too, for
	// what reaches it through events.k8s.io).
	for what, e := range map[string]*corev1.Event{
		"about its Node, in a namespace":   event(ns, nodeA, nodeRef(nodeA)),
		"about a pod of another namespace": event(metav1.NamespaceDefault, nodeA, podRef),
	} {
		if err := write(e); !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
			t.Errorf("the agent writing an Event %s: %v, want it refused", what, err)
		}
	}
	// Another component's Event (the kubelet's, on node A) is not the
	// agent's to patch, even to something the agent could write.
	foreign := event(metav1.NamespaceDefault, nodeA, nodeRef(nodeA))
	foreign.Source, foreign.ReportingController, foreign.ReportingInstance = corev1.EventSource{Component: "kubelet", Host: "elsewhere"}, "kubelet", "elsewhere"
	foreign, err = cluster.Client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, foreign, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"count":2,"source":{"component":"resclass-node-agent","host":"` + nodeA + `"},"reportingInstance":"` + nodeA + `"}`)
	_, err = ac.CoreV1().Events(metav1.NamespaceDefault).Patch(ctx, foreign.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), asItself) {
		t.Errorf("the agent patching the kubelet's Event: %v, want Forbidden: %s", err, asItself)
	}
	// events.k8s.io/v1: the same rules on its fields.
	newEvent := func(instance string, regarding corev1.ObjectReference) *eventsv1.Event {
		return &eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-", Namespace: metav1.NamespaceDefault},
			EventTime:  metav1.NewMicroTime(time.Now()), ReportingController: "resclass.io/node-agent", ReportingInstance: instance,
			Action: "Probe", Reason: "E2EProbe", Regarding: regarding, Type: corev1.EventTypeNormal,
		}
	}
	if _, err := ac.EventsV1().Events(metav1.NamespaceDefault).Create(ctx, newEvent(nodeA, nodeRef(nodeA)), metav1.CreateOptions{}); err != nil {
		t.Errorf("the agent writing an events.k8s.io Event about its Node: %v", err)
	}
	_, err = ac.EventsV1().Events(metav1.NamespaceDefault).Create(ctx, newEvent(nodeB, nodeRef(nodeA)), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), asItself) {
		t.Errorf("the agent writing an events.k8s.io Event as node B: %v, want Forbidden: %s", err, asItself)
	}
	_, err = ac.EventsV1().Events(metav1.NamespaceDefault).Create(ctx, newEvent(nodeA, nodeRef(nodeB)), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), aboutItsOwn) {
		t.Errorf("the agent writing an events.k8s.io Event about node B: %v, want Forbidden: %s", err, aboutItsOwn)
	}
	// A token without the node claim writes no Event at all.
	unbound, err := kubernetes.NewForConfig(cluster.NodeAgentConfig(""))
	if err != nil {
		t.Fatal(err)
	}
	_, err = unbound.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, event(metav1.NamespaceDefault, nodeA, nodeRef(nodeA)), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "node-name claim is missing") {
		t.Errorf("the agent's identity without the node claim: %v, want Forbidden", err)
	}
}
