package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/sets"
	schedulerconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	schedulerscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	schedulervalidation "k8s.io/kubernetes/pkg/scheduler/apis/config/validation"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/deploy/install"
	"github.com/resclass/resclass/pkg/quota"
	"github.com/resclass/resclass/pkg/scheduler/resourceclasses"
)

const (
	ns = install.Namespace
	// agentNS is the node agent's own namespace: Pod Security privileged,
	// for its host paths, while ns enforces restricted.
	agentNS = install.NodeAgentNamespace
)

// clusterScoped and namespaced are the kinds the install may contain; a kind
// in neither fails the test, so that a new kind is placed deliberately.
var (
	clusterScoped = sets.New("Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
		"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
	namespaced = sets.New("ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Secret", "Service",
		"Deployment", "DaemonSet", "PodDisruptionBudget", "ResourceQuota", "Issuer", "Certificate", "PodMonitor", "NetworkPolicy")
	// Objects that must live outside resclass-system, and why.
	otherNamespace = map[string]string{
		// The scheduler's delegated authentication reads
		// kube-system/extension-apiserver-authentication.
		"RoleBinding/kube-system/resclass-scheduler-auth-reader": "kube-system",
		// ... and so does the opt-in stock profile's (scheduler.dra).
		"RoleBinding/kube-system/resclass-dra-scheduler-auth-reader": "kube-system",
		// The node agent, alone in its privileged namespace (and out of
		// the restricted one).
		"ServiceAccount/" + agentNS + "/resclass-node-agent":   agentNS,
		"DaemonSet/" + agentNS + "/resclass-node-agent":        agentNS,
		"Service/" + agentNS + "/resclass-node-agent-metrics":  agentNS,
		"ResourceQuota/" + agentNS + "/resclass-critical-pods": agentNS,
		// The MPS control daemons beside it: privileged too.
		"ServiceAccount/" + agentNS + "/resclass-mps-control": agentNS,
		"DaemonSet/" + agentNS + "/resclass-mps-control":      agentNS,
	}
)

func TestKustomizeBase(t *testing.T) {
	objs, err := install.Kustomize()
	if err != nil {
		t.Fatal(err)
	}
	set := check(t, objs)

	// Every generated CRD is installed: `make generate` may add files that
	// kustomization.yaml must list by name.
	root, err := install.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "deploy/crds/*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want, got []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		crd, err := install.Decode(data)
		if err != nil || len(crd) != 1 {
			t.Fatalf("%s: %v", f, err)
		}
		want = append(want, crd[0].GetName())
	}
	for _, o := range set.kind("CustomResourceDefinition") {
		got = append(got, o.GetName())
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("CRDs rendered %v, deploy/crds has %v: list every file of deploy/crds in deploy/kustomization.yaml", got, want)
	}

	// Pod Security: resclass-system restricted, the agent's namespace (its
	// hostPath volumes) privileged. e2e/install_test.go has the apiserver
	// enforce both.
	for namespace, level := range map[string]string{ns: "restricted", agentNS: "privileged"} {
		labels := set.get(t, "Namespace", "", namespace).GetLabels()
		if l := labels["pod-security.kubernetes.io/enforce"]; l != level {
			t.Errorf("Namespace %s: pod-security.kubernetes.io/enforce = %q, want %s", namespace, l, level)
		}
		if v := labels["pod-security.kubernetes.io/enforce-version"]; v != "latest" {
			t.Errorf("Namespace %s: pod-security.kubernetes.io/enforce-version = %q, want latest", namespace, v)
		}
	}

	// The node agent is privileged by default (issue 35: NVML opens the
	// host's GPUs itself, with no NVIDIA_VISIBLE_DEVICES for a hardened
	// runtime to refuse), names GPUs by CDI (cdi-cri), and its probes and
	// /metrics are HTTPS (--metrics-secure, on by default).
	ds := typed[appsv1.DaemonSet](t, set.get(t, "DaemonSet", agentNS, "resclass-node-agent"))
	checkAgent(t, ds, true, "cdi-cri")
}

// checkAgent checks the agent's privileges (privileged: the default; else
// the unprivileged container with NVIDIA_VISIBLE_DEVICES=all) and its
// device-list strategy; a CDI strategy writes the CDI spec directory.
func checkAgent(t *testing.T, ds *appsv1.DaemonSet, privileged bool, strategy string) {
	t.Helper()
	pod := ds.Spec.Template.Spec
	c := pod.Containers[0]
	sc := c.SecurityContext
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if privileged {
		if sc == nil || sc.Privileged == nil || !*sc.Privileged {
			t.Errorf("node agent: securityContext %+v, want privileged", sc)
		}
		// A hardened runtime ignores the variable in an unprivileged
		// container, and a privileged one needs none of it.
		for _, name := range []string{"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"} {
			if v, ok := env[name]; ok {
				t.Errorf("node agent: privileged, and still sets %s=%s", name, v)
			}
		}
	} else {
		if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
			t.Errorf("node agent: securityContext %+v, want unprivileged with every capability dropped", sc)
		}
		if env["NVIDIA_VISIBLE_DEVICES"] != "all" {
			t.Errorf("node agent: unprivileged without NVIDIA_VISIBLE_DEVICES=all: NVML would see no GPU (env %v)", env)
		}
	}
	if got, _ := arg(c.Args, "device-list-strategy"); got != strategy {
		t.Errorf("node agent: --device-list-strategy=%q, want %s (written out, whatever the binary's default)", got, strategy)
	}
	cdi := strings.Contains(strategy, "cdi-")
	if pod.SecurityContext == nil || pod.SecurityContext.SeccompProfile == nil || pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("node agent: want seccomp RuntimeDefault, pod securityContext %+v", pod.SecurityContext)
	}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("node agent: probe %+v, want HTTPS (--metrics-secure)", p)
		}
	}
	// Stopping announces it (AgentServing False, at most 5 s), serves on
	// (--shutdown-delay, 2 s), drains the endpoints (5 s with the default
	// --pod-wait and --pod-resources-timeout) and writes the Events
	// (--shutdown-timeout, 10 s): the kubelet must not kill the agent before.
	if g := pod.TerminationGracePeriodSeconds; g == nil || *g < 5+2+5+10+5 {
		t.Errorf("node agent: terminationGracePeriodSeconds %v, want at least 27 (announce 5 s, delay 2 s, drain 5 s, Events 10 s, 5 s to spare)", g)
	}
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--metrics-secure") {
			t.Errorf("node agent: default args carry %s", a)
		}
	}
	for _, m := range c.VolumeMounts {
		if !m.ReadOnly && !slices.Contains([]string{"/var/lib/kubelet/device-plugins", "/var/run/resclass"}, m.MountPath) && (!cdi || m.MountPath != "/var/run/cdi") {
			t.Errorf("node agent: %s is mounted writable", m.MountPath)
		}
	}
}

// TestHelmChart renders the chart with its defaults and with each option, and
// checks that the defaults give the kustomize base's objects.
func TestHelmChart(t *testing.T) {
	ctx := context.Background()
	root, err := install.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}

	// helm reads the chart in another process: read it here too, so that go
	// test's cache knows the result depends on it.
	readAll(t, filepath.Join(root, install.Chart))

	if out, err := install.Helm(ctx, "lint", "--strict", install.Chart); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}

	// The chart's crds/ are copies of deploy/crds (Helm needs them inside the
	// chart); `make generate` rewrites deploy/crds only.
	t.Run("crds in sync", func(t *testing.T) {
		generated, _ := filepath.Glob(filepath.Join(root, "deploy/crds/*.yaml"))
		copies, _ := filepath.Glob(filepath.Join(root, install.Chart, "crds/*.yaml"))
		if len(generated) == 0 || len(generated) != len(copies) {
			t.Errorf("deploy/crds has %d CRDs, %s/crds %d", len(generated), install.Chart, len(copies))
		}
		for _, g := range generated {
			want, _ := os.ReadFile(g)
			got, err := os.ReadFile(filepath.Join(root, install.Chart, "crds", filepath.Base(g)))
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("%s/crds/%s differs from deploy/crds: run cp deploy/crds/*.yaml %s/crds/", install.Chart, filepath.Base(g), install.Chart)
			}
		}
	})

	t.Run("defaults are the kustomize base", func(t *testing.T) {
		helmObjs, err := install.HelmTemplate(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		check(t, helmObjs)
		kustomized, err := install.Kustomize()
		if err != nil {
			t.Fatal(err)
		}
		sameObjects(t, kustomized, helmObjs)
		for _, o := range helmObjs {
			if strings.HasPrefix(o.GetName(), "resclass-distribution") {
				t.Errorf("the ResourceDistribution controller is opt-in, but the defaults render %s", key(o))
			}
			if strings.HasPrefix(o.GetName(), "resclass-dra-scheduler") {
				t.Errorf("the stock profile resclass-dra is opt-in, but the defaults render %s", key(o))
			}
		}
	})

	t.Run("nodeAgent.nvidiaRuntimeConfigs mounts each file's directory", func(t *testing.T) {
		configs := []string{"/etc/nvidia-container-runtime/config.toml", "/opt/nvidia/runtime/config.toml", "/opt/nvidia/runtime/other.toml", "/usr/local/toolkit/config.toml"}
		set := check(t, helmTemplate(t, map[string]any{"nodeAgent": map[string]any{"nvidiaRuntimeConfigs": configs}}))
		spec := podSpec(t, set, "DaemonSet", "resclass-node-agent")
		if got, _ := arg(spec.Containers[0].Args, "nvidia-runtime-config"); got != strings.Join(configs, ",") {
			t.Errorf("--nvidia-runtime-config=%s, want %s", got, strings.Join(configs, ","))
		}
		// (checkNodeAgent checked that each is the host's file.) One mount per
		// directory, none for /usr's.
		var mounts int
		for _, v := range spec.Volumes {
			if strings.HasPrefix(v.Name, "nvidia-runtime-config") {
				mounts++
			}
		}
		if mounts != 2 {
			t.Errorf("%d runtime configuration mounts, want 2 (/etc/nvidia-container-runtime, /opt/nvidia/runtime)", mounts)
		}
		for _, bad := range []string{"/sys/x/config.toml", "/etc/../config.toml", "config.toml", "/config.toml", "/etc/a,b/config.toml"} {
			if objs, err := install.HelmTemplate(ctx, map[string]any{"nodeAgent": map[string]any{"nvidiaRuntimeConfigs": []string{bad}}}); err == nil {
				t.Errorf("nvidiaRuntimeConfigs [%s] rendered %d objects, want an error", bad, len(objs))
			}
		}
	})

	t.Run("nodeAgent.dra.enabled is the kustomize base with the component deploy/node-agent/dra", func(t *testing.T) {
		helmObjs := helmTemplate(t, map[string]any{"nodeAgent": map[string]any{"dra": map[string]any{"enabled": true}}})
		set := check(t, helmObjs)
		kustomized := kustomizeWithComponent(t, "node-agent", "dra")
		sameObjects(t, kustomized, helmObjs)
		ds := typed[appsv1.DaemonSet](t, set.get(t, "DaemonSet", agentNS, "resclass-node-agent"))
		for _, p := range []string{"/var/lib/kubelet/plugins/resclass.io/dra.sock", "/var/lib/kubelet/plugins_registry/resclass.io-reg.sock", "/var/run/cdi/resclass.io-claim_x.json"} {
			if v, m := mountOf(ds.Spec.Template.Spec, p); v == nil || v.HostPath == nil || m.ReadOnly || path.Join(v.HostPath.Path, strings.TrimPrefix(p, m.MountPath)) != p {
				t.Errorf("DRA: %s is not the host's same path, writable: %+v", p, v)
			}
		}
	})

	t.Run("scheduler.dra.enabled is the kustomize base with the component deploy/scheduler/dra", func(t *testing.T) {
		helmObjs := helmTemplate(t, map[string]any{"scheduler": map[string]any{"dra": map[string]any{"enabled": true}}})
		set := check(t, helmObjs)
		kustomized := kustomizeWithComponent(t, "scheduler", "dra")
		sameObjects(t, kustomized, helmObjs)
		checkDRAScheduler(t, check(t, kustomized))
		checkDRAScheduler(t, set)

		// The options, and the image it shares with the resclass scheduler.
		set = check(t, helmTemplate(t, map[string]any{"image": map[string]any{"registry": "registry.example/team", "tag": "v9"},
			"scheduler": map[string]any{"dra": map[string]any{"enabled": true, "replicas": 3, "extraArgs": []string{"--v=4"}}}}))
		d := typed[appsv1.Deployment](t, set.get(t, "Deployment", ns, "resclass-dra-scheduler"))
		if c := d.Spec.Template.Spec.Containers[0]; *d.Spec.Replicas != 3 || !slices.Contains(c.Args, "--v=4") || c.Image != "registry.example/team/resclass-scheduler:v9" {
			t.Errorf("scheduler.dra replicas 3, --v=4, image v9: replicas %d, args %v, image %s", *d.Spec.Replicas, c.Args, c.Image)
		}
		if _, err := install.HelmTemplate(ctx, map[string]any{"scheduler": map[string]any{"dra": map[string]any{"enabled": true, "leaseName": "x"}}}); err == nil {
			t.Errorf("scheduler.dra.leaseName, an unknown value, rendered")
		}
	})

	t.Run("distribution.enabled is the kustomize base with the component deploy/distribution", func(t *testing.T) {
		helmObjs := helmTemplate(t, map[string]any{"distribution": map[string]any{"enabled": true}})
		set := check(t, helmObjs)
		kustomized := kustomizeWithComponent(t, "distribution")
		sameObjects(t, kustomized, helmObjs)

		// Its own identity, in its own Deployment, fenced by the policy.
		spec := podSpec(t, set, "Deployment", "resclass-distribution")
		if spec.ServiceAccountName != "resclass-distribution" || !slices.Contains(spec.Containers[0].Args, "--mode=distribution-controller") {
			t.Errorf("resclass-distribution runs as %q with %v", spec.ServiceAccountName, spec.Containers[0].Args)
		}
		vap := typed[admissionregistrationv1.ValidatingAdmissionPolicy](t, set.get(t, "ValidatingAdmissionPolicy", "", "resclass-distribution-writes"))
		if user := "system:serviceaccount:" + ns + ":resclass-distribution"; len(vap.Spec.MatchConditions) == 0 || !strings.Contains(vap.Spec.MatchConditions[0].Expression, `"`+user+`"`) {
			t.Errorf("the policy does not match %s: %+v", user, vap.Spec.MatchConditions)
		}
		set.get(t, "ValidatingAdmissionPolicyBinding", "", "resclass-distribution-writes")

		args := containerArgs(t, check(t, helmTemplate(t, map[string]any{"distribution": map[string]any{"enabled": true, "authorizationTTL": "1m"}})), "Deployment", "resclass-distribution")
		if !slices.Contains(args, "--distribution-authorization-ttl=1m") {
			t.Errorf("authorizationTTL 1m: args %v", args)
		}
		if _, err := install.HelmTemplate(ctx, map[string]any{"distribution": map[string]any{"enabled": true, "authorizationTTL": "soon"}}); err == nil {
			t.Errorf("authorizationTTL soon rendered")
		}

		// The author guard: its policy renders whatever is enabled, and the
		// controller without the webhook does not render at all.
		for _, values := range []map[string]any{nil, {"webhook": map[string]any{"enabled": false}}, {"distribution": map[string]any{"enabled": true}}} {
			set := check(t, helmTemplate(t, values))
			set.get(t, "ValidatingAdmissionPolicy", "", "resclass-spec-author")
			set.get(t, "ValidatingAdmissionPolicyBinding", "", "resclass-spec-author")
		}
		_, err := install.HelmTemplate(ctx, map[string]any{"distribution": map[string]any{"enabled": true}, "webhook": map[string]any{"enabled": false}})
		if err == nil || !strings.Contains(err.Error(), "distribution.enabled=true needs webhook.enabled=true") {
			t.Errorf("the controller without the webhook: %v, want the chart's refusal", err)
		}
	})

	// The webhook's identity may touch no Secret or ConfigMap outside its
	// namespace, and in it write only its TLS Secret: the controller's
	// rights are not the webhook's.
	t.Run("the webhook's RBAC holds no Secret rights, the rotator's only its Secret", func(t *testing.T) {
		objs, err := install.Kustomize()
		if err != nil {
			t.Fatal(err)
		}
		set := check(t, objs)
		for _, name := range []string{"resclass-webhook", "resclass-webhook-certs"} {
			cr := typed[rbacv1.ClusterRole](t, set.get(t, "ClusterRole", "", name))
			for _, r := range cr.Rules {
				if slices.Contains(r.Resources, "secrets") || slices.Contains(r.Resources, "configmaps") || slices.Contains(r.Resources, "*") {
					t.Errorf("ClusterRole %s grants %v on %v", name, r.Verbs, r.Resources)
				}
				if slices.Contains(r.Resources, "validatingwebhookconfigurations") && (name == "resclass-webhook" || !slices.Equal(r.ResourceNames, []string{"resclass-webhook"})) {
					t.Errorf("ClusterRole %s: %v on webhook configurations %v", name, r.Verbs, r.ResourceNames)
				}
			}
		}
		// The webhook serves the Secret the kubelet mounts: its Role in its
		// namespace grants Events and nothing else (no Secret, no Lease).
		if o := set.find("Role", ns, "resclass-webhook"); o != nil {
			for _, r := range typed[rbacv1.Role](t, o).Rules {
				if !slices.Equal(r.Resources, []string{"events"}) || len(r.ResourceNames) > 0 || slices.ContainsFunc(r.Verbs, func(v string) bool { return v != "create" && v != "patch" }) {
					t.Errorf("the webhook's Role in %s grants %v on %v; it needs to create Events only", ns, r.Verbs, r.Resources)
				}
			}
		}
		for _, o := range set.kind("Role") {
			role := typed[rbacv1.Role](t, o)
			for _, r := range role.Rules {
				for _, v := range r.Verbs {
					switch {
					case slices.Contains(r.Resources, "secrets") && (role.Name != "resclass-webhook-certs" || !slices.Equal(r.ResourceNames, []string{"resclass-webhook-tls"})):
						t.Errorf("Role %s: %s secrets %v", role.Name, v, r.ResourceNames)
					case slices.Contains(r.Resources, "leases") && v != "create" && len(r.ResourceNames) == 0:
						t.Errorf("Role %s: %s on every Lease", role.Name, v)
					}
				}
			}
		}
	})

	t.Run("images", func(t *testing.T) {
		set := check(t, helmTemplate(t, map[string]any{
			"image":     map[string]any{"registry": "registry.example/team", "tag": "v9"},
			"scheduler": map[string]any{"image": map[string]any{"tag": "v10"}},
		}))
		for kind, want := range map[string]string{
			"DaemonSet/resclass-node-agent": "registry.example/team/resclass-node-agent:v9",
			"Deployment/resclass-scheduler": "registry.example/team/resclass-scheduler:v10",
			"Deployment/resclass-webhook":   "registry.example/team/resclass-webhook:v9",
		} {
			k, name, _ := strings.Cut(kind, "/")
			if got := podSpec(t, set, k, name).Containers[0].Image; got != want {
				t.Errorf("%s: image %s, want %s", kind, got, want)
			}
		}
	})

	t.Run("cert-manager", func(t *testing.T) {
		set := check(t, helmTemplate(t, map[string]any{"webhook": map[string]any{"certManagement": "certManager"}}))
		if set.find("Secret", ns, "resclass-webhook-tls") != nil {
			t.Errorf("certManager renders the Secret resclass-webhook-tls: the Certificate creates it")
		}
		set.get(t, "Issuer", ns, "resclass-selfsigned")
		cert := set.get(t, "Certificate", ns, "resclass-webhook")
		if s, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName"); s != "resclass-webhook-tls" {
			t.Errorf("Certificate secretName %q", s)
		}
		dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
		if !slices.Contains(dns, "resclass-webhook."+ns+".svc") {
			t.Errorf("Certificate dnsNames %v lack the Service's name", dns)
		}
		for _, kind := range []string{"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"} {
			if a := set.get(t, kind, "", "resclass-webhook").GetAnnotations()["cert-manager.io/inject-ca-from"]; a != ns+"/resclass-webhook" {
				t.Errorf("%s: inject-ca-from = %q", kind, a)
			}
		}
		for _, k := range []string{"Deployment", "ServiceAccount", "Role", "ClusterRole"} {
			if set.find(k, ns, "resclass-webhook-certs") != nil || set.find(k, "", "resclass-webhook-certs") != nil {
				t.Errorf("certManager renders the cert rotator's %s: cert-manager does its work", k)
			}
		}
		if set.find("ValidatingAdmissionPolicy", "", "resclass-webhook-certs-writes") != nil {
			t.Errorf("certManager renders the cert rotator's admission policy")
		}
		// The webhook serves /metrics with cert-manager's certificate, and
		// its PodMonitor verifies it against the Secret's ca.crt, under a
		// name the Certificate holds.
		if args := containerArgs(t, set, "Deployment", "resclass-webhook"); !slices.Contains(args, "--metrics-cert-from-cert-dir") {
			t.Errorf("certManager: the webhook's args %v lack --metrics-cert-from-cert-dir", args)
		}
		monitored := check(t, helmTemplate(t, map[string]any{"webhook": map[string]any{"certManagement": "certManager"},
			"monitoring": map[string]any{"podMonitor": map[string]any{"enabled": true}}}))
		for _, component := range []string{"webhook", "scheduler"} {
			endpoints, _, _ := unstructured.NestedSlice(monitored.get(t, "PodMonitor", ns, "resclass-"+component).Object, "spec", "podMetricsEndpoints")
			tlsConfig, _ := endpoints[0].(map[string]any)["tlsConfig"].(map[string]any)
			secret, _, _ := unstructured.NestedStringMap(tlsConfig, "ca", "secret")
			serverName, _ := tlsConfig["serverName"].(string)
			switch {
			case component == "webhook" && (tlsConfig["insecureSkipVerify"] != nil || secret["name"] != "resclass-webhook-tls" || secret["key"] != "ca.crt" || !slices.Contains(dns, serverName)):
				t.Errorf("certManager: the webhook's PodMonitor tlsConfig %v, want the CA of resclass-webhook-tls and a serverName of %v", tlsConfig, dns)
			case component != "webhook" && tlsConfig["insecureSkipVerify"] != true:
				t.Errorf("PodMonitor %s: tlsConfig %v; its certificate is self-signed at start, nothing verifies it", component, tlsConfig)
			}
		}
		// Self-managed (the default): the rotator's policy names its
		// ServiceAccount.
		self := check(t, helmTemplate(t, nil))
		vap := typed[admissionregistrationv1.ValidatingAdmissionPolicy](t, self.get(t, "ValidatingAdmissionPolicy", "", "resclass-webhook-certs-writes"))
		if user := "system:serviceaccount:" + ns + ":resclass-webhook-certs"; len(vap.Spec.MatchConditions) == 0 || !strings.Contains(vap.Spec.MatchConditions[0].Expression, `"`+user+`"`) {
			t.Errorf("resclass-webhook-certs-writes does not match %s: %+v", user, vap.Spec.MatchConditions)
		}
		self.get(t, "ValidatingAdmissionPolicyBinding", "", "resclass-webhook-certs-writes")
	})

	t.Run("webhook options", func(t *testing.T) {
		set := check(t, helmTemplate(t, map[string]any{"webhook": map[string]any{"replicas": 3}}))
		if d := typed[appsv1.Deployment](t, set.get(t, "Deployment", ns, "resclass-webhook")); *d.Spec.Replicas != 3 {
			t.Errorf("replicas %d", *d.Spec.Replicas)
		}
		for _, old := range []string{"quotaConfig", "allowEmptyNamespaceSelector"} {
			if _, err := install.HelmTemplate(ctx, map[string]any{"webhook": map[string]any{old: ""}}); err == nil {
				t.Errorf("webhook.%s, replaced by webhook.policies, still renders: an upgrade must not silently drop it", old)
			}
		}
	})

	// The pod policies are opt-in: the defaults render no pods or workloads
	// webhook, no rule and no refusal.
	t.Run("webhook.policies off: no pod policy is enforced", func(t *testing.T) {
		for name, set := range map[string]*objects{"helm": check(t, helmTemplate(t, nil)), "kustomize": check(t, kustomizeBase(t))} {
			vwc := typed[admissionregistrationv1.ValidatingWebhookConfiguration](t, set.get(t, "ValidatingWebhookConfiguration", "", "resclass-webhook"))
			for _, wh := range vwc.Webhooks {
				if wh.Name == "pods.resclass.io" || wh.Name == "workloads.resclass.io" {
					t.Errorf("%s: the default install renders %s", name, wh.Name)
				}
			}
			args := containerArgs(t, set, "Deployment", "resclass-webhook")
			for _, a := range args {
				if strings.HasPrefix(a, "--quota-config") || a == "--refuse-empty-namespace-selector" {
					t.Errorf("%s: the default install passes %s", name, a)
				}
			}
			if !slices.Contains(args, "--match-conditions-cover=None") {
				t.Errorf("%s: args %v lack --match-conditions-cover=None", name, args)
			}
			if set.find("ConfigMap", ns, "resclass-webhook-quota") != nil {
				t.Errorf("%s: the default install renders the covering-quota rule", name)
			}
		}
	})

	t.Run("webhook.policies of the component deploy/webhook/policies are that component", func(t *testing.T) {
		helmObjs := helmTemplate(t, map[string]any{"webhook": map[string]any{"policies": map[string]any{
			"emptyNamespaceSelector": true, "crossNamespaceAffinityQuota": true, "priorityClassQuota": []any{"cluster-services"},
		}}})
		check(t, helmObjs)
		sameObjects(t, kustomizeWithComponent(t, "webhook", "policies"), helmObjs)
	})

	// The matchConditions, the rule and the flags follow the values: each
	// policy's pods are sent and others not, checked by evaluating the
	// rendered CEL on pods.
	t.Run("webhook.policies render the matchConditions, the rule and the flags together", func(t *testing.T) {
		for _, tc := range []struct {
			name     string
			policies map[string]any
			cover    string
			scopes   []string // the rule's scopes, as quota.Config prints them
			contains []string
			sent     []string // pods (of policyPods) the pods webhook is called for
		}{
			{name: "emptyNamespaceSelector", policies: map[string]any{"emptyNamespaceSelector": true},
				cover: "EmptyNamespaceSelector", sent: []string{"empty-selector"}},
			{name: "crossNamespaceAffinityQuota", policies: map[string]any{"crossNamespaceAffinityQuota": true},
				cover: "CrossNamespacePodAffinity", scopes: []string{"{CrossNamespacePodAffinity Exists []}"},
				sent: []string{"empty-selector", "cross-namespace", "cross-namespace-preferred"}},
			{name: "priorityClassQuota", policies: map[string]any{"priorityClassQuota": []any{"cluster-services", "high"}},
				cover: "PriorityClass=cluster-services,PriorityClass=high", scopes: []string{"{PriorityClass In [cluster-services high]}"},
				sent: []string{"cluster-services", "high"}},
			{name: "priorityClassQuota *", policies: map[string]any{"priorityClassQuota": []any{"*"}},
				cover: "PriorityClass", scopes: []string{"{PriorityClass Exists []}"},
				sent: []string{"cluster-services", "high", "system-node-critical"}},
			{name: "resourceQuota", policies: map[string]any{"resourceQuota": []any{"class.resclass.io/"}},
				cover: "Contains=class.resclass.io/", contains: []string{"class.resclass.io/"},
				sent: []string{"class-limit", "class-request-init"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				set := check(t, helmTemplate(t, map[string]any{"webhook": map[string]any{"policies": tc.policies}}))
				args := containerArgs(t, set, "Deployment", "resclass-webhook")
				if !slices.Contains(args, "--match-conditions-cover="+tc.cover) {
					t.Errorf("args %v, want --match-conditions-cover=%s", args, tc.cover)
				}
				if got := slices.Contains(args, "--refuse-empty-namespace-selector"); got != (tc.policies["emptyNamespaceSelector"] == true) {
					t.Errorf("--refuse-empty-namespace-selector passed: %v, with %v", got, tc.policies)
				}
				file, ok := arg(args, "quota-config")
				if ok != (tc.scopes != nil || tc.contains != nil) {
					t.Fatalf("--quota-config passed: %v, with %v", ok, tc.policies)
				}
				if ok {
					cfg, err := quota.Parse([]byte(configMapFile(t, set, podSpec(t, set, "Deployment", "resclass-webhook"), file)))
					if err != nil {
						t.Fatal(err)
					}
					var scopes []string
					for _, s := range cfg.Scopes() {
						scopes = append(scopes, fmt.Sprint(s))
					}
					if !slices.Equal(scopes, tc.scopes) || !slices.Equal(cfg.MatchContains(), tc.contains) {
						t.Errorf("the rule limits %v and %v, want %v and %v", scopes, cfg.MatchContains(), tc.scopes, tc.contains)
					}
				}
				vwc := typed[admissionregistrationv1.ValidatingWebhookConfiguration](t, set.get(t, "ValidatingWebhookConfiguration", "", "resclass-webhook"))
				for _, wh := range vwc.Webhooks {
					if wh.Name != "pods.resclass.io" && wh.Name != "workloads.resclass.io" {
						continue
					}
					for name, pod := range policyPods() {
						obj := map[string]any{"apiVersion": "v1", "kind": "Pod", "spec": pod}
						if wh.Name == "workloads.resclass.io" {
							obj = map[string]any{"apiVersion": "batch/v1", "kind": "CronJob", "spec": map[string]any{
								"jobTemplate": map[string]any{"spec": map[string]any{"template": map[string]any{"spec": pod}}}}}
						}
						if got, want := matches(t, wh.MatchConditions, obj), slices.Contains(tc.sent, name); got != want {
							t.Errorf("%s sends pod %s: %v, want %v", wh.Name, name, got, want)
						}
					}
				}
			})
		}
		if _, err := install.HelmTemplate(ctx, map[string]any{"webhook": map[string]any{"policies": map[string]any{"resourceQuota": []any{"pods"}}}}); err == nil {
			t.Errorf("webhook.policies.resourceQuota [pods] rendered: every pod consumes pods, no matchCondition narrows it")
		}
	})

	t.Run("webhook admission options", func(t *testing.T) {
		set := check(t, helmTemplate(t, map[string]any{"webhook": map[string]any{
			"admission": map[string]any{
				"pods":               map[string]any{"failurePolicy": "Ignore", "timeoutSeconds": 7},
				"distributionAuthor": map[string]any{"failurePolicy": "Ignore", "timeoutSeconds": 9},
			},
			"excludedNamespaces": []any{"kube-system", "monitoring"},
		}}))
		vwc := typed[admissionregistrationv1.ValidatingWebhookConfiguration](t, set.get(t, "ValidatingWebhookConfiguration", "", "resclass-webhook"))
		for _, wh := range vwc.Webhooks {
			policy, timeout := admissionregistrationv1.Fail, map[string]int32{"resourceclasses.resclass.io": 5, "resourcedistributions.resclass.io": 10, "workloads.resclass.io": 3}[wh.Name]
			switch wh.Name {
			case "pods.resclass.io":
				policy, timeout = admissionregistrationv1.Ignore, 7
			case "workloads.resclass.io":
				policy = admissionregistrationv1.Ignore
			}
			if *wh.FailurePolicy != policy || *wh.TimeoutSeconds != timeout {
				t.Errorf("webhook %s: failurePolicy %s, timeoutSeconds %d, want %s, %d", wh.Name, *wh.FailurePolicy, *wh.TimeoutSeconds, policy, timeout)
			}
			if wh.NamespaceSelector != nil && !slices.Equal(wh.NamespaceSelector.MatchExpressions[0].Values, []string{ns, agentNS, "kube-system", "monitoring"}) {
				t.Errorf("webhook %s: excluded namespaces %v", wh.Name, wh.NamespaceSelector.MatchExpressions[0].Values)
			}
		}
		mwc := typed[admissionregistrationv1.MutatingWebhookConfiguration](t, set.get(t, "MutatingWebhookConfiguration", "", "resclass-webhook"))
		if wh := mwc.Webhooks[0]; *wh.FailurePolicy != admissionregistrationv1.Ignore || *wh.TimeoutSeconds != 9 {
			t.Errorf("mutating webhook: failurePolicy %s, timeoutSeconds %d", *wh.FailurePolicy, *wh.TimeoutSeconds)
		}
		// The schema refuses what the apiserver would.
		for _, bad := range []map[string]any{
			{"admission": map[string]any{"pods": map[string]any{"failurePolicy": "Maybe", "timeoutSeconds": 3}}},
			{"admission": map[string]any{"pods": map[string]any{"failurePolicy": "Fail", "timeoutSeconds": 31}}},
			{"excludedNamespaces": []any{"Not_A_Namespace"}},
		} {
			if _, err := install.HelmTemplate(context.Background(), map[string]any{"webhook": bad}); err == nil {
				t.Errorf("webhook values %v rendered", bad)
			}
		}
	})

	t.Run("monitoring", func(t *testing.T) {
		set := check(t, helmTemplate(t, map[string]any{
			"monitoring":   map[string]any{"podMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "kps"}}},
			"distribution": map[string]any{"enabled": true},
			"scheduler":    map[string]any{"dra": map[string]any{"enabled": true}},
		}))
		for component, kind := range map[string]string{"node-agent": "DaemonSet", "scheduler": "Deployment", "webhook": "Deployment", "distribution": "Deployment", "dra-scheduler": "Deployment"} {
			pm := set.get(t, "PodMonitor", ns, "resclass-"+component)
			if pm.GetLabels()["release"] != "kps" {
				t.Errorf("PodMonitor %s: labels %v lack release=kps", component, pm.GetLabels())
			}
			sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
			spec := podSpec(t, set, kind, "resclass-"+component)
			var pod map[string]string
			if kind == "DaemonSet" {
				// The agent lives in its own namespace; its PodMonitor,
				// beside the scraper's token, selects it there.
				if got, _, _ := unstructured.NestedStringSlice(pm.Object, "spec", "namespaceSelector", "matchNames"); !slices.Equal(got, []string{agentNS}) {
					t.Errorf("PodMonitor node-agent: namespaceSelector %v, want the agent's namespace", got)
				}
				pod = typed[appsv1.DaemonSet](t, set.get(t, kind, agentNS, "resclass-"+component)).Spec.Template.Labels
			} else {
				pod = typed[appsv1.Deployment](t, set.get(t, kind, ns, "resclass-"+component)).Spec.Template.Labels
			}
			for k, v := range sel {
				if pod[k] != v {
					t.Errorf("PodMonitor %s selects %v, the pods are labelled %v", component, sel, pod)
				}
			}
			endpoints, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
			if len(endpoints) != 1 {
				t.Fatalf("PodMonitor %s: endpoints %v", component, endpoints)
			}
			ep := endpoints[0].(map[string]any)
			if !slices.ContainsFunc(spec.Containers[0].Ports, func(p corev1.ContainerPort) bool { return p.Name == ep["port"] }) {
				t.Errorf("PodMonitor %s scrapes port %v, which the container does not name", component, ep["port"])
			}
			if ep["scheme"] != "https" || ep["authorization"] == nil {
				t.Errorf("PodMonitor %s: %v, want HTTPS with the scraper's token", component, ep)
			}
			// The agent's resclass_node_agent_device_holder keeps its holder's
			// namespace and pod (honorLabels), and the agent's series get its
			// node: the dashboard's queries (dashboard_test.go's
			// nodeAgentTargetLabels) stand on both.
			relabelings, _, _ := unstructured.NestedSlice(ep, "relabelings")
			if component == "node-agent" {
				if ep["honorLabels"] != true || len(relabelings) != 1 ||
					!cmp.Equal(relabelings[0], map[string]any{"sourceLabels": []any{"__meta_kubernetes_pod_node_name"}, "targetLabel": "node"}) {
					t.Errorf("PodMonitor node-agent: honorLabels %v, relabelings %v; want true and __meta_kubernetes_pod_node_name to node", ep["honorLabels"], relabelings)
				}
			} else if ep["honorLabels"] != nil || relabelings != nil {
				t.Errorf("PodMonitor %s: honorLabels %v, relabelings %v; want the target's labels as they are", component, ep["honorLabels"], relabelings)
			}
		}
		// The scraper may GET /metrics and nothing else.
		role := typed[rbacv1.ClusterRole](t, set.get(t, "ClusterRole", "", "resclass-metrics-scraper"))
		if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].NonResourceURLs, []string{"/metrics"}) || !slices.Equal(role.Rules[0].Verbs, []string{"get"}) || len(role.Rules[0].Resources) != 0 {
			t.Errorf("resclass-metrics-scraper: rules %+v, want GET /metrics only", role.Rules)
		}
		if sec := typed[corev1.Secret](t, set.get(t, "Secret", ns, "resclass-metrics-scraper-token")); sec.Type != corev1.SecretTypeServiceAccountToken ||
			sec.Annotations[corev1.ServiceAccountNameKey] != "resclass-metrics-scraper" {
			t.Errorf("the scraper's token Secret: %+v", sec)
		}
		// Plain HTTP when the agent serves it so.
		set = check(t, helmTemplate(t, map[string]any{"monitoring": map[string]any{"podMonitor": map[string]any{"enabled": true}},
			"nodeAgent": map[string]any{"metrics": map[string]any{"secure": false}}}))
		endpoints, _, _ := unstructured.NestedSlice(set.get(t, "PodMonitor", ns, "resclass-node-agent").Object, "spec", "podMetricsEndpoints")
		if ep := endpoints[0].(map[string]any); ep["scheme"] != "http" || ep["authorization"] != nil {
			t.Errorf("node agent with plain HTTP metrics: %v", ep)
		}
		if set.find("PodMonitor", ns, "resclass-distribution") != nil || set.find("PodMonitor", ns, "resclass-dra-scheduler") != nil {
			t.Error("a PodMonitor for the distribution controller or the stock profile, which are off")
		}
	})

	t.Run("grafana.dashboard", func(t *testing.T) {
		if set := check(t, helmTemplate(t, nil)); set.find("ConfigMap", ns, "resclass-grafana-dashboard") != nil {
			t.Error("the Grafana dashboard is opt-in, but the defaults render it")
		}
		want, err := os.ReadFile(filepath.Join(root, dashboardFile))
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name      string
			values    map[string]any
			namespace string
			labels    map[string]string
		}{
			{"the sidecar's default label", map[string]any{"enabled": true}, ns, map[string]string{"grafana_dashboard": "1"}},
			{"another label, more labels, another namespace", map[string]any{"enabled": true, "namespace": "monitoring", "label": "dashboards", "labelValue": "resclass",
				"labels": map[string]any{"team": "gpu"}, "annotations": map[string]any{"grafana_folder": "resclass"}}, "monitoring", map[string]string{"dashboards": "resclass", "team": "gpu"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				objs := helmTemplate(t, map[string]any{"grafana": map[string]any{"dashboard": tc.values}})
				var set *objects
				if tc.namespace == ns {
					set = check(t, objs)
				} else {
					set = &objects{all: objs, byKey: map[string]*unstructured.Unstructured{}}
					for _, o := range objs {
						set.byKey[key(o)] = o
					}
				}
				cm := typed[corev1.ConfigMap](t, set.get(t, "ConfigMap", tc.namespace, "resclass-grafana-dashboard"))
				for k, v := range tc.labels {
					if cm.Labels[k] != v {
						t.Errorf("labels %v lack %s=%s", cm.Labels, k, v)
					}
				}
				if tc.values["annotations"] != nil && cm.Annotations["grafana_folder"] != "resclass" {
					t.Errorf("annotations %v", cm.Annotations)
				}
				if len(cm.Data) != 1 || cm.Data["resclass.json"] != strings.TrimRight(string(want), "\n") {
					t.Errorf("data: %d keys; resclass.json is not %s", len(cm.Data), dashboardFile)
				}
				var d map[string]any
				if err := json.Unmarshal([]byte(cm.Data["resclass.json"]), &d); err != nil || d["uid"] != "resclass" {
					t.Errorf("resclass.json: uid %v, %v", d["uid"], err)
				}
			})
		}
		if _, err := install.HelmTemplate(context.Background(), map[string]any{"grafana": map[string]any{"dashboard": map[string]any{"enabled": true, "label": ""}}}); err == nil {
			t.Error("grafana.dashboard.label \"\" rendered")
		}
	})

	t.Run("webhook.networkPolicy", func(t *testing.T) {
		if set := check(t, helmTemplate(t, nil)); len(set.kind("NetworkPolicy")) != 0 {
			t.Error("the defaults render a NetworkPolicy: it is opt-in (a wrong one cuts off a webhook that fails closed)")
		}
		// Enabled without the apiserver's peers: an ingress rule with no
		// peers admits everyone, so the chart refuses to render it.
		if _, err := install.HelmTemplate(context.Background(), map[string]any{"webhook": map[string]any{"networkPolicy": map[string]any{"enabled": true}}}); err == nil ||
			!strings.Contains(err.Error(), "webhook.networkPolicy.apiserver") {
			t.Errorf("networkPolicy.enabled without apiserver peers: %v, want a render failure naming webhook.networkPolicy.apiserver", err)
		}
		apiserver := []any{map[string]any{"ipBlock": map[string]any{"cidr": "10.0.0.0/28"}}}
		set := check(t, helmTemplate(t, map[string]any{"webhook": map[string]any{"networkPolicy": map[string]any{"enabled": true, "apiserver": apiserver}}}))
		np := typed[networkingv1.NetworkPolicy](t, set.get(t, "NetworkPolicy", ns, "resclass-webhook"))
		pod := typed[appsv1.Deployment](t, set.get(t, "Deployment", ns, "resclass-webhook")).Spec.Template
		if !labelsMatch(np.Spec.PodSelector.MatchLabels, pod.Labels) || len(np.Spec.PodSelector.MatchLabels) == 0 {
			t.Errorf("the NetworkPolicy selects %v, the webhook's pods are labelled %v", np.Spec.PodSelector.MatchLabels, pod.Labels)
		}
		rotator := typed[appsv1.Deployment](t, set.get(t, "Deployment", ns, "resclass-webhook-certs")).Spec.Template
		if labelsMatch(np.Spec.PodSelector.MatchLabels, rotator.Labels) {
			t.Error("the NetworkPolicy selects the cert rotator's pods too")
		}
		if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
			t.Errorf("policyTypes %v, want Ingress only (the webhook's calls to the apiserver stay open)", np.Spec.PolicyTypes)
		}
		svc := typed[corev1.Service](t, set.get(t, "Service", ns, "resclass-webhook"))
		rules := map[int32][]networkingv1.NetworkPolicyPeer{}
		for _, r := range np.Spec.Ingress {
			for _, p := range r.Ports {
				port := containerPort(pod.Spec, *p.Port)
				if port == 0 {
					t.Errorf("the NetworkPolicy admits port %v, which the webhook's container does not have", p.Port)
				}
				rules[port] = r.From
			}
		}
		if from := rules[containerPort(pod.Spec, svc.Spec.Ports[0].TargetPort)]; len(from) != 1 || from[0].IPBlock == nil || from[0].IPBlock.CIDR != "10.0.0.0/28" {
			t.Errorf("the webhook port (the Service's target) admits %+v, want the apiserver's 10.0.0.0/28 alone", from)
		}
		if from := rules[containerPort(pod.Spec, intstr.FromString("metrics"))]; len(from) != 1 || from[0].NamespaceSelector == nil ||
			from[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" {
			t.Errorf("the metrics port admits %+v, want the namespace monitoring", from)
		}
		if len(rules) != 2 {
			t.Errorf("the NetworkPolicy admits ports %v, want the webhook's and the metrics'", slices.Collect(maps.Keys(rules)))
		}
	})

	t.Run("scheduler options", func(t *testing.T) {
		for _, strategy := range []string{"FirstFit", "BinPack", "Spread", "NUMAAligned", "Topology"} {
			set := check(t, helmTemplate(t, map[string]any{"scheduler": map[string]any{"strategy": strategy, "assignmentWrite": "PreBind"}}))
			args := schedulerArgs(t, set)
			if string(args.Strategy) != strategy || args.AssignmentWrite != resourceclasses.WriteInPreBind {
				t.Errorf("strategy %s: the configuration says %s, %s", strategy, args.Strategy, args.AssignmentWrite)
			}
		}
		// More assignment writers: users beside the scheduler, and groups.
		set := check(t, helmTemplate(t, map[string]any{"scheduler": map[string]any{"assignmentWriters": map[string]any{
			"users": []string{"system:serviceaccount:ops:repair"}, "groups": []string{"ops-admins"},
		}}}))
		vap := typed[admissionregistrationv1.ValidatingAdmissionPolicy](t, set.get(t, "ValidatingAdmissionPolicy", "", "resclass-assignment-writers"))
		if e := vap.Spec.MatchConditions[0].Expression; !strings.Contains(e, `"system:serviceaccount:ops:repair"`) || !strings.Contains(e, `["ops-admins"]`) {
			t.Errorf("assignmentWriters: the policy's match condition %q lacks the user or the group", e)
		}
		for _, bad := range []map[string]any{{"strategy": "Random"}, {"assignmentWrite": "Patch"}, {"assignmentWriters": map[string]any{"user": []string{"x"}}}} {
			if objs, err := install.HelmTemplate(ctx, map[string]any{"scheduler": bad}); err == nil {
				t.Errorf("scheduler %v rendered %d objects, want an error", bad, len(objs))
			}
		}
	})

	t.Run("node agent options", func(t *testing.T) {
		set := check(t, helmTemplate(t, map[string]any{"nodeAgent": map[string]any{"privileged": false}}))
		ds := typed[appsv1.DaemonSet](t, set.get(t, "DaemonSet", agentNS, "resclass-node-agent"))
		checkAgent(t, ds, false, "cdi-cri")
		set = check(t, helmTemplate(t, map[string]any{"nodeAgent": map[string]any{"deviceListStrategy": "envvar"}}))
		ds = typed[appsv1.DaemonSet](t, set.get(t, "DaemonSet", agentNS, "resclass-node-agent"))
		checkAgent(t, ds, true, "envvar")

		// A CDI strategy with the GPU operator's driver root: the strategy,
		// the spec directory (a writable host path) and the driver root below
		// --host-root, where the agent reads the files the spec names.
		set = check(t, helmTemplate(t, map[string]any{"nodeAgent": map[string]any{
			"deviceListStrategy": "envvar,cdi-cri",
			"nvml":               map[string]any{"driverRoot": "/run/nvidia/driver"},
		}}))
		ds = typed[appsv1.DaemonSet](t, set.get(t, "DaemonSet", agentNS, "resclass-node-agent"))
		checkAgent(t, ds, true, "envvar,cdi-cri")
		c := ds.Spec.Template.Spec.Containers[0]
		for _, a := range []string{"--device-list-strategy=envvar,cdi-cri", "--cdi-spec-dir=/var/run/cdi", "--cdi-driver-root=/run/nvidia/driver"} {
			if !slices.Contains(c.Args, a) {
				t.Errorf("CDI: args %v lack %s", c.Args, a)
			}
		}
		if v, m := mountOf(ds.Spec.Template.Spec, "/var/run/cdi/resclass.io-gpu.yaml"); v == nil || v.HostPath == nil || v.HostPath.Path != "/var/run/cdi" || m.ReadOnly {
			t.Errorf("CDI: /var/run/cdi is not the host's, writable: %+v", v)
		}
		if v, m := mountOf(ds.Spec.Template.Spec, "/host/run/nvidia/driver/usr/bin/nvidia-smi"); v == nil || v.HostPath == nil || v.HostPath.Path != "/run/nvidia/driver" || !m.ReadOnly {
			t.Errorf("CDI: the driver root is not below /host, read-only: %+v", v)
		}
		if _, err := install.HelmTemplate(ctx, map[string]any{"nodeAgent": map[string]any{"deviceListStrategy": "cdi"}}); err == nil {
			t.Errorf("deviceListStrategy cdi rendered")
		}

		// Plain HTTP metrics: the flag, and probes without HTTPS.
		set = check(t, helmTemplate(t, map[string]any{"nodeAgent": map[string]any{"metrics": map[string]any{"secure": false}}}))
		ds = typed[appsv1.DaemonSet](t, set.get(t, "DaemonSet", agentNS, "resclass-node-agent"))
		c = ds.Spec.Template.Spec.Containers[0]
		if !slices.Contains(c.Args, "--metrics-secure=false") || c.LivenessProbe.HTTPGet.Scheme == corev1.URISchemeHTTPS {
			t.Errorf("metrics.secure=false: args %v, probe scheme %s", c.Args, c.LivenessProbe.HTTPGet.Scheme)
		}

		set = check(t, helmTemplate(t, map[string]any{"nodeAgent": map[string]any{
			"nvml": map[string]any{"driverRoot": "/run/nvidia/driver"},
		}}))
		ds = typed[appsv1.DaemonSet](t, set.get(t, "DaemonSet", agentNS, "resclass-node-agent"))
		c = ds.Spec.Template.Spec.Containers[0]
		if !slices.Contains(c.Args, "--nvml-library=/driver-root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1") {
			t.Errorf("driverRoot: args %v", c.Args)
		}
		var mount *corev1.VolumeMount
		for i := range c.VolumeMounts {
			if c.VolumeMounts[i].MountPath == "/driver-root" {
				mount = &c.VolumeMounts[i]
			}
		}
		if mount == nil || !mount.ReadOnly || mount.MountPropagation == nil || *mount.MountPropagation != corev1.MountPropagationHostToContainer {
			t.Errorf("driverRoot: mount %+v, want /driver-root read-only with HostToContainer propagation", mount)
		}

		set = check(t, helmTemplate(t, map[string]any{"nodeAgent": map[string]any{"nvml": map[string]any{"library": ""}}}))
		for _, a := range containerArgs(t, set, "DaemonSet", "resclass-node-agent") {
			if strings.HasPrefix(a, "--nvml-library") {
				t.Errorf("library \"\" still passes %s", a)
			}
		}
		if _, err := install.HelmTemplate(ctx, map[string]any{"nodeAgent": map[string]any{"nvml": map[string]any{"library": "lib64/libnvidia-ml.so.1"}}}); err == nil {
			t.Errorf("a library outside usr/ with driverRoot / rendered")
		}
	})

	t.Run("GPU isolation policy", func(t *testing.T) {
		// The allow-list reaches the first matchCondition as CEL lists: the
		// agent's namespace first, then the values.
		set := check(t, helmTemplate(t, map[string]any{"nodeAgent": map[string]any{"gpuIsolationPolicy": map[string]any{
			"allowedNamespaces":      []string{"gpu-operator", agentNS},
			"allowedServiceAccounts": []string{"monitoring:dcgm-exporter"},
		}}}))
		vap := typed[admissionregistrationv1.ValidatingAdmissionPolicy](t, set.get(t, "ValidatingAdmissionPolicy", "", "resclass-gpu-isolation"))
		expr := vap.Spec.MatchConditions[0].Expression
		for _, want := range []string{`request.namespace in ["` + agentNS + `","gpu-operator"]`, `in ["monitoring:dcgm-exporter"]`} {
			if !strings.Contains(expr, want) {
				t.Errorf("allow-list: the first matchCondition lacks %s: %s", want, expr)
			}
		}
		set.get(t, "ValidatingAdmissionPolicyBinding", "", "resclass-gpu-isolation")
		// Off: neither object.
		for _, o := range helmTemplate(t, map[string]any{"nodeAgent": map[string]any{"gpuIsolationPolicy": map[string]any{"enabled": false}}}) {
			if o.GetName() == "resclass-gpu-isolation" {
				t.Errorf("gpuIsolationPolicy.enabled=false renders %s", key(o))
			}
		}
		// Entries that are not names never reach the expression (a quote
		// would end the CEL string and add a condition of its own).
		for _, bad := range []map[string]any{
			{"allowedNamespaces": []string{`x"] || true || ["`}},
			{"allowedNamespaces": []string{"Gpu-Operator"}},
			{"allowedServiceAccounts": []string{"dcgm-exporter"}},
			{"allowedServiceAccounts": []string{`a:b"] || true || ["`}},
		} {
			if objs, err := install.HelmTemplate(ctx, map[string]any{"nodeAgent": map[string]any{"gpuIsolationPolicy": bad}}); err == nil {
				t.Errorf("gpuIsolationPolicy %v rendered %d objects, want a schema error", bad, len(objs))
			}
		}
	})

	t.Run("components off", func(t *testing.T) {
		for _, component := range []string{"nodeAgent", "scheduler", "webhook"} {
			name := map[string]string{"nodeAgent": "node-agent", "scheduler": "scheduler", "webhook": "webhook"}[component]
			objs := helmTemplate(t, map[string]any{component: map[string]any{"enabled": false}})
			check(t, objs)
			for _, o := range objs {
				if strings.HasPrefix(o.GetName(), "resclass-"+name) {
					t.Errorf("%s.enabled=false still renders %s", component, key(o))
				}
			}
		}
	})

	t.Run("nodeAgent.mps", func(t *testing.T) {
		for _, o := range helmTemplate(t, map[string]any{"nodeAgent": map[string]any{"mps": map[string]any{"enabled": false}}}) {
			if strings.HasPrefix(o.GetName(), "resclass-mps-control") {
				t.Errorf("nodeAgent.mps.enabled=false renders %s", key(o))
			}
		}
		set := check(t, helmTemplate(t, map[string]any{"nodeAgent": map[string]any{
			"mps":  map[string]any{"exclusiveProcess": false, "extraArgs": []string{"--probe-period=20s"}},
			"nvml": map[string]any{"driverRoot": "/run/nvidia/driver"},
		}}))
		spec := podSpec(t, set, "DaemonSet", "resclass-mps-control")
		if args := spec.Containers[0].Args; !slices.Contains(args, "--exclusive-process=false") || !slices.Contains(args, "--probe-period=20s") {
			t.Errorf("exclusiveProcess false, extraArgs: args %v", args)
		}
		if v, _ := mountOf(spec, "/driver-root/usr/bin/x"); v == nil || v.HostPath.Path != "/run/nvidia/driver" {
			t.Errorf("nvml.driverRoot /run/nvidia/driver: the driver root is %+v", v)
		}
	})

	t.Run("another namespace", func(t *testing.T) {
		out, err := install.Helm(ctx, "template", install.ReleaseName, install.Chart, "--namespace", "gpu-system", "--set", "distribution.enabled=true")
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(out, []byte(ns)) {
			t.Errorf("rendered into gpu-system, the chart still names %s", ns)
		}
	})

	t.Run("the node agent in the release namespace", func(t *testing.T) {
		objs := helmTemplate(t, map[string]any{"nodeAgent": map[string]any{"namespace": ""}})
		for _, o := range objs {
			if o.GetKind() == "Namespace" || o.GetNamespace() == agentNS {
				t.Errorf("nodeAgent.namespace \"\" renders %s", key(o))
			}
		}
		set := &objects{all: objs, byKey: map[string]*unstructured.Unstructured{}}
		for _, o := range objs {
			set.byKey[key(o)] = o
		}
		set.get(t, "DaemonSet", ns, "resclass-node-agent")
		vap := typed[admissionregistrationv1.ValidatingAdmissionPolicy](t, set.get(t, "ValidatingAdmissionPolicy", "", "resclass-node-agent-own-node"))
		if user := "system:serviceaccount:" + ns + ":resclass-node-agent"; !strings.Contains(vap.Spec.MatchConditions[0].Expression, `"`+user+`"`) {
			t.Errorf("the agent's policy does not match %s: %s", user, vap.Spec.MatchConditions[0].Expression)
		}
		if _, err := install.HelmTemplate(ctx, map[string]any{"nodeAgent": map[string]any{"namespace": "Not_A_Name"}}); err == nil {
			t.Errorf("nodeAgent.namespace Not_A_Name rendered")
		}
	})
}

// sameObjects compares a kustomize render with a Helm render, less the
// Namespace resclass-system (helm install --create-namespace creates it: a
// release cannot contain the namespace it is stored in) and Helm's own labels.
// kustomizeWithComponent renders an overlay as the docs show it: the base
// deploy/ with the component at deploy/<elem...>.
func kustomizeWithComponent(t *testing.T, elem ...string) []*unstructured.Unstructured {
	t.Helper()
	root, err := install.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	overlay := t.TempDir()
	// kustomize takes no absolute paths.
	base, err := filepath.Rel(overlay, filepath.Join(root, install.Base))
	if err != nil {
		t.Fatal(err)
	}
	kustomization := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%s]\ncomponents: [%s]\n",
		base, filepath.Join(append([]string{base}, elem...)...))
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	kustomized, err := install.KustomizeDir(overlay)
	if err != nil {
		t.Fatal(err)
	}
	return kustomized
}

func sameObjects(t *testing.T, kustomized, helmObjs []*unstructured.Unstructured) {
	t.Helper()
	want := map[string]any{}
	for _, o := range kustomized {
		if o.GetKind() == "Namespace" && o.GetName() == ns {
			continue
		}
		n := normalize(t, o)
		want[key(n)] = n.Object
	}
	got := map[string]any{}
	for _, o := range helmObjs {
		n := normalize(t, o)
		got[key(n)] = n.Object
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("helm template differs from the kustomize render (-kustomize +helm):\n%s", diff)
	}
}

func helmTemplate(t *testing.T, values map[string]any) []*unstructured.Unstructured {
	t.Helper()
	objs, err := install.HelmTemplate(context.Background(), values)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// objects indexes a rendered install.
type objects struct {
	all   []*unstructured.Unstructured
	byKey map[string]*unstructured.Unstructured
}

func key(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetKind() + "/" + o.GetName()
	}
	return o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
}

func (s *objects) find(kind, namespace, name string) *unstructured.Unstructured {
	o := &unstructured.Unstructured{}
	o.SetKind(kind)
	o.SetNamespace(namespace)
	o.SetName(name)
	return s.byKey[key(o)]
}

func (s *objects) get(t *testing.T, kind, namespace, name string) *unstructured.Unstructured {
	t.Helper()
	o := s.find(kind, namespace, name)
	if o == nil {
		t.Fatalf("no %s %s/%s rendered", kind, namespace, name)
	}
	return o
}

func (s *objects) kind(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range s.all {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// typed converts o strictly: a field the type does not have (a typo) fails.
func typed[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, out, true); err != nil {
		t.Fatalf("%s: %v", key(o), err)
	}
	return out
}

// workload is a Deployment's or DaemonSet's pod template.
type workload struct {
	key       string
	namespace string
	spec      corev1.PodSpec
	meta      map[string]string // pod labels
}

// check asserts what must hold of any rendering of the install, and returns
// the objects indexed.
func check(t *testing.T, objs []*unstructured.Unstructured) *objects {
	t.Helper()
	set := &objects{all: objs, byKey: map[string]*unstructured.Unstructured{}}
	for _, o := range objs {
		k := key(o)
		if set.byKey[k] != nil {
			t.Errorf("%s rendered twice", k)
		}
		set.byKey[k] = o
		switch {
		case clusterScoped.Has(o.GetKind()):
			if o.GetNamespace() != "" {
				t.Errorf("%s is cluster-scoped but has namespace %q", k, o.GetNamespace())
			}
		case namespaced.Has(o.GetKind()):
			want := ns
			if w, ok := otherNamespace[k]; ok {
				want = w
			}
			if o.GetNamespace() != want {
				t.Errorf("%s: namespace %q, want %q", k, o.GetNamespace(), want)
			}
		default:
			t.Errorf("%s: kind %s is neither in clusterScoped nor in namespaced of this test: add it where it belongs", k, o.GetKind())
		}
	}

	var workloads []workload
	for _, o := range set.kind("Deployment") {
		d := typed[appsv1.Deployment](t, o)
		// The cert rotator may run alone: nothing waits on it (the webhook
		// serves the mounted certificate while it is away).
		if d.Name != "resclass-webhook-certs" && (d.Spec.Replicas == nil || *d.Spec.Replicas < 2) {
			t.Errorf("%s: want at least 2 replicas", key(o))
		}
		workloads = append(workloads, workload{key(o), o.GetNamespace(), d.Spec.Template.Spec, d.Spec.Template.Labels})
	}
	for _, o := range set.kind("DaemonSet") {
		d := typed[appsv1.DaemonSet](t, o)
		// Replacing the MPS control pod ends every MPS client of its node:
		// the operator deletes it, no rollout does.
		if d.Name == "resclass-mps-control" {
			if d.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
				t.Errorf("%s: updateStrategy %s, want OnDelete", key(o), d.Spec.UpdateStrategy.Type)
			}
		} else if d.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || d.Spec.UpdateStrategy.RollingUpdate == nil || d.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable == nil {
			t.Errorf("%s: want a RollingUpdate with maxUnavailable", key(o))
		}
		workloads = append(workloads, workload{key(o), o.GetNamespace(), d.Spec.Template.Spec, d.Spec.Template.Labels})
	}
	for _, w := range workloads {
		checkPodSpec(t, set, w)
	}

	// Services and PDBs select pods of a workload, and a Service's named
	// target port is one of its containers' ports.
	selects := func(selector map[string]string) *workload {
		for i, w := range workloads {
			if len(selector) > 0 && labelsMatch(selector, w.meta) {
				return &workloads[i]
			}
		}
		return nil
	}
	for _, o := range set.kind("Service") {
		s := typed[corev1.Service](t, o)
		w := selects(s.Spec.Selector)
		if w == nil {
			t.Errorf("%s selects no workload's pods", key(o))
			continue
		}
		for _, p := range s.Spec.Ports {
			if containerPort(w.spec, p.TargetPort) == 0 {
				t.Errorf("%s port %s: target %s is no container port of %s", key(o), p.Name, p.TargetPort.String(), w.key)
			}
		}
	}
	for _, o := range set.kind("PodDisruptionBudget") {
		sel, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
		if selects(sel) == nil {
			t.Errorf("%s selects no workload's pods", key(o))
		}
	}

	// RBAC subjects are ServiceAccounts the install creates.
	for _, kind := range []string{"RoleBinding", "ClusterRoleBinding"} {
		for _, o := range set.kind(kind) {
			b := typed[rbacv1.ClusterRoleBinding](t, o)
			for _, s := range b.Subjects {
				if s.Kind == "ServiceAccount" && set.find("ServiceAccount", s.Namespace, s.Name) == nil {
					t.Errorf("%s binds ServiceAccount %s/%s, which is not rendered", key(o), s.Namespace, s.Name)
				}
			}
			if b.RoleRef.Kind == "Role" && !strings.HasPrefix(b.RoleRef.Name, "extension-apiserver-") && set.find("Role", o.GetNamespace(), b.RoleRef.Name) == nil {
				t.Errorf("%s refers to Role %s, which is not rendered", key(o), b.RoleRef.Name)
			}
			if b.RoleRef.Kind == "ClusterRole" && !strings.HasPrefix(b.RoleRef.Name, "system:") && set.find("ClusterRole", "", b.RoleRef.Name) == nil {
				t.Errorf("%s refers to ClusterRole %s, which is not rendered", key(o), b.RoleRef.Name)
			}
		}
	}

	// The pods webhook fails closed: it must not stand between resclass's
	// own workloads and their pods (the webhook could not start, the agent
	// could not roll out onto a new node while the webhook is down).
	for _, o := range set.kind("ValidatingWebhookConfiguration") {
		for _, wh := range typed[admissionregistrationv1.ValidatingWebhookConfiguration](t, o).Webhooks {
			if !slices.ContainsFunc(wh.Rules, func(r admissionregistrationv1.RuleWithOperations) bool { return slices.Contains(r.Resources, "pods") }) {
				continue
			}
			var excluded []string
			if wh.NamespaceSelector != nil {
				for _, e := range wh.NamespaceSelector.MatchExpressions {
					if e.Key == "kubernetes.io/metadata.name" && e.Operator == metav1.LabelSelectorOpNotIn {
						excluded = append(excluded, e.Values...)
					}
				}
			}
			for _, w := range workloads {
				if !slices.Contains(excluded, w.namespace) {
					t.Errorf("webhook %s guards pods in %s, where %s runs: exclude the namespace (namespaceSelector NotIn %v)", wh.Name, w.namespace, w.key, excluded)
				}
			}
		}
	}

	if set.find("DaemonSet", agentNS, "resclass-node-agent") != nil {
		checkNodeAgent(t, set)
	}
	if set.find("DaemonSet", agentNS, "resclass-mps-control") != nil {
		checkMPSControl(t, set)
	}
	if set.find("Deployment", ns, "resclass-scheduler") != nil {
		checkScheduler(t, set)
	}
	if set.find("Deployment", ns, "resclass-webhook") != nil {
		checkWebhook(t, set)
	}
	return set
}

func labelsMatch(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// containerPort resolves a Service's targetPort in a pod; 0 if it is none.
func containerPort(spec corev1.PodSpec, target intstr.IntOrString) int32 {
	for _, c := range spec.Containers {
		for _, p := range c.Ports {
			if (target.Type == intstr.String && p.Name == target.StrVal) || (target.Type == intstr.Int && p.ContainerPort == target.IntVal) {
				return p.ContainerPort
			}
		}
	}
	return 0
}

// writableHostPaths are the host directories the node agent writes to: the
// kubelet's device-plugin sockets and its own introspection socket; with
// nodeAgent.dra.enabled also draHostPaths (and the CDI spec directory).
var writableHostPaths = sets.New("/var/lib/kubelet/device-plugins", "/var/run/resclass")

// mpsHostPaths are what the MPS control daemons write: their pipe, log and
// state directories, and the /dev/shm they share with their clients.
var mpsHostPaths = sets.New("/run/resclass/mps", "/run/resclass/mps/shm")

// draHostPaths are its DRA plugin's directory and the kubelet's registration
// directory.
var draHostPaths = sets.New("/var/lib/kubelet/plugins/resclass.io", "/var/lib/kubelet/plugins_registry")

var imageRef = regexp.MustCompile(`^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)+:[A-Za-z0-9._-]+$`)

func checkPodSpec(t *testing.T, set *objects, w workload) {
	t.Helper()
	spec := w.spec
	if spec.ServiceAccountName == "" || set.find("ServiceAccount", w.namespace, spec.ServiceAccountName) == nil {
		t.Errorf("%s runs as ServiceAccount %q, which is not rendered", w.key, spec.ServiceAccountName)
	}
	if spec.NodeSelector["kubernetes.io/os"] != "linux" {
		t.Errorf("%s: want nodeSelector kubernetes.io/os: linux", w.key)
	}
	if spec.PriorityClassName == "" {
		t.Errorf("%s: no priorityClassName", w.key)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
		if v.ConfigMap != nil && set.find("ConfigMap", w.namespace, v.ConfigMap.Name) == nil {
			t.Errorf("%s: volume %s mounts ConfigMap %s, which is not rendered", w.key, v.Name, v.ConfigMap.Name)
		}
		if v.Secret != nil && set.find("Secret", w.namespace, v.Secret.SecretName) == nil && !certificateWrites(set, v.Secret.SecretName) {
			t.Errorf("%s: volume %s mounts Secret %s, which is not rendered (nor written by a rendered cert-manager Certificate)", w.key, v.Name, v.Secret.SecretName)
		}
	}
	for _, c := range spec.Containers {
		where := w.key + " container " + c.Name
		if !imageRef.MatchString(c.Image) || strings.HasSuffix(c.Image, ":latest") {
			t.Errorf("%s: image %q, want registry/repository:tag (not latest)", where, c.Image)
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if _, ok := c.Resources.Requests[r]; !ok {
				t.Errorf("%s: no %s request", where, r)
			}
		}
		if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
			t.Errorf("%s: no memory limit", where)
		}
		checkGoMemoryLimit(t, where, c)
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: want securityContext.readOnlyRootFilesystem", where)
			continue
		}
		privileged := sc.Privileged != nil && *sc.Privileged
		if !privileged {
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("%s: want allowPrivilegeEscalation: false", where)
			}
			if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
				t.Errorf("%s: want capabilities {drop: [ALL]}", where)
			}
		}
		// Only the node agent (the kubelet's device-plugin directory is
		// root's) and the MPS control daemons (compute modes) run as root.
		root := sc.RunAsUser != nil && *sc.RunAsUser == 0
		if root != (c.Name == "node-agent" || c.Name == "mps-control") {
			t.Errorf("%s: runs as root: %v", where, root)
		}
		if !root && (spec.SecurityContext == nil || spec.SecurityContext.RunAsNonRoot == nil || !*spec.SecurityContext.RunAsNonRoot) {
			t.Errorf("%s: want runAsNonRoot", where)
		}
		for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
			if p == nil || p.HTTPGet == nil {
				t.Errorf("%s: want HTTP liveness and readiness probes", where)
				continue
			}
			if containerPort(corev1.PodSpec{Containers: []corev1.Container{c}}, p.HTTPGet.Port) == 0 {
				t.Errorf("%s: probe %s on port %s, which the container does not declare", where, p.HTTPGet.Path, p.HTTPGet.Port.String())
			}
		}
		for _, m := range c.VolumeMounts {
			v, ok := volumes[m.Name]
			if !ok {
				t.Errorf("%s: mounts volume %s, which the pod does not have", where, m.Name)
				continue
			}
			// A subPath mount of a ConfigMap never sees updates.
			if v.ConfigMap != nil && m.SubPath != "" {
				t.Errorf("%s: ConfigMap %s mounted with subPath: edits would not reach it", where, v.ConfigMap.Name)
			}
			// The agent writes its sockets, nothing else, on the host; and
			// with a CDI device-list strategy the CDI spec.
			strategy, _ := arg(c.Args, "device-list-strategy")
			dra := volumes["dra-plugin"].HostPath != nil
			if v.HostPath != nil && !m.ReadOnly && !writableHostPaths.Has(v.HostPath.Path) && (!dra || !draHostPaths.Has(v.HostPath.Path)) &&
				(c.Name != "mps-control" || !mpsHostPaths.Has(v.HostPath.Path)) &&
				((!strings.Contains(strategy, "cdi-") && !dra) || m.MountPath != "/var/run/cdi") {
				t.Errorf("%s: host path %s is mounted writable", where, v.HostPath.Path)
			}
		}
	}
}

// certificateWrites reports whether a rendered cert-manager Certificate
// creates the Secret name.
func certificateWrites(set *objects, name string) bool {
	for _, c := range set.kind("Certificate") {
		if s, _, _ := unstructured.NestedString(c.Object, "spec", "secretName"); s == name && c.GetNamespace() == ns {
			return true
		}
	}
	return false
}

// arg returns the value of --name=value in args, and whether it is there.
func arg(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func containerArgs(t *testing.T, set *objects, kind, name string) []string {
	t.Helper()
	spec := podSpec(t, set, kind, name)
	return spec.Containers[0].Args
}

func podSpec(t *testing.T, set *objects, kind, name string) corev1.PodSpec {
	t.Helper()
	if kind == "DaemonSet" {
		return typed[appsv1.DaemonSet](t, set.get(t, kind, agentNS, name)).Spec.Template.Spec
	}
	o := set.get(t, kind, ns, name)
	return typed[appsv1.Deployment](t, o).Spec.Template.Spec
}

// mountedFile finds the volume a file path lies in and returns it with the
// path below the mount.
// mountOf returns the volume and the mount that file is on.
func mountOf(spec corev1.PodSpec, file string) (*corev1.Volume, corev1.VolumeMount) {
	for _, m := range spec.Containers[0].VolumeMounts {
		if !strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
			continue
		}
		for i, v := range spec.Volumes {
			if v.Name == m.Name {
				return &spec.Volumes[i], m
			}
		}
	}
	return nil, corev1.VolumeMount{}
}

func mountedFile(spec corev1.PodSpec, file string) (*corev1.Volume, string) {
	for _, m := range spec.Containers[0].VolumeMounts {
		rel, ok := strings.CutPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for i, v := range spec.Volumes {
			if v.Name == m.Name {
				return &spec.Volumes[i], rel
			}
		}
	}
	return nil, ""
}

// configMapFile returns the content of a file the container reads from a
// mounted ConfigMap.
func configMapFile(t *testing.T, set *objects, spec corev1.PodSpec, file string) string {
	t.Helper()
	v, rel := mountedFile(spec, file)
	if v == nil || v.ConfigMap == nil {
		t.Fatalf("%s is on no mounted ConfigMap", file)
	}
	cm := typed[corev1.ConfigMap](t, set.get(t, "ConfigMap", ns, v.ConfigMap.Name))
	data, ok := cm.Data[rel]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s (for %s)", cm.Name, rel, file)
	}
	return data
}

// checkGoMemoryLimit holds docs/install.md's headroom rule ("Sizing"): every
// container sets GOMEMLIMIT, below its memory limit by at least 15% for what
// is not Go heap (the mapped binary, stacks, buffers; NVML in the node agent),
// so that the collector works harder before the kernel kills the container;
// and with GOGC=off, where the heap grows to GOMEMLIMIT whatever the load, the
// memory request is the limit, so that the scheduler counts what the pod will
// use.
func checkGoMemoryLimit(t *testing.T, where string, c corev1.Container) {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env[e.Name] = e.Value
		}
	}
	goLimit, err := parseGoMemLimit(env["GOMEMLIMIT"])
	if err != nil {
		t.Errorf("%s: GOMEMLIMIT %q: %v", where, env["GOMEMLIMIT"], err)
		return
	}
	limit, ok := c.Resources.Limits[corev1.ResourceMemory]
	if !ok {
		return
	}
	if float64(goLimit) > 0.85*float64(limit.Value()) {
		t.Errorf("%s: GOMEMLIMIT %s is not below the memory limit %s by 15%%", where, env["GOMEMLIMIT"], limit.String())
	}
	if request := c.Resources.Requests[corev1.ResourceMemory]; env["GOGC"] == "off" && request.Cmp(limit) != 0 {
		t.Errorf("%s: GOGC=off grows the heap to GOMEMLIMIT %s whatever the load: request the memory limit %s, not %s", where, env["GOMEMLIMIT"], limit.String(), request.String())
	}
}

func TestParseGoMemLimit(t *testing.T) {
	for in, want := range map[string]int64{"400MiB": 400 << 20, "1GiB": 1 << 30, "1024": 1024, "12B": 12, "3KiB": 3 << 10, "1TiB": 1 << 40} {
		if got, err := parseGoMemLimit(in); err != nil || got != want {
			t.Errorf("parseGoMemLimit(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "400M", "-1", "0", "1.5GiB", "99999999999TiB"} {
		if got, err := parseGoMemLimit(in); err == nil {
			t.Errorf("parseGoMemLimit(%q) = %d, want an error", in, got)
		}
	}
}

// parseGoMemLimit reads a GOMEMLIMIT as the Go runtime does: bytes, or a
// number with one of the suffixes B, KiB, MiB, GiB, TiB.
func parseGoMemLimit(s string) (int64, error) {
	unit := int64(1)
	for i, suffix := range []string{"TiB", "GiB", "MiB", "KiB", "B"} {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			s, unit = n, int64(1)<<(10*(4-i))
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > math.MaxInt64/unit {
		return 0, errors.New("want a positive number of bytes, or one with a suffix B, KiB, MiB, GiB or TiB")
	}
	return n * unit, nil
}

func checkNodeAgent(t *testing.T, set *objects) {
	t.Helper()
	spec := podSpec(t, set, "DaemonSet", "resclass-node-agent")
	c := spec.Containers[0]
	var nodeName bool
	for _, e := range c.Env {
		nodeName = nodeName || (e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName")
	}
	if !nodeName {
		t.Errorf("node agent: no NODE_NAME from spec.nodeName")
	}
	hostPathAt := func(file string) string {
		v, rel := mountedFile(spec, file)
		if v == nil || v.HostPath == nil {
			return ""
		}
		return path.Join(v.HostPath.Path, rel)
	}
	dir, _ := arg(c.Args, "device-plugin-dir")
	if got := hostPathAt(path.Join(dir, "kubelet.sock")); got != "/var/lib/kubelet/device-plugins/kubelet.sock" {
		t.Errorf("node agent: --device-plugin-dir %q is host path %q, want the kubelet's /var/lib/kubelet/device-plugins", dir, got)
	}
	sock, _ := arg(c.Args, "introspection-socket")
	if hostPathAt(sock) == "" {
		t.Errorf("node agent: --introspection-socket %q is not on a host path (node-agent status on the node reads it)", sock)
	}
	hostRoot, _ := arg(c.Args, "host-root")
	for _, p := range []string{"sys", "dev", "usr"} {
		if got := hostPathAt(path.Join(hostRoot, p, "x")); got != path.Join("/", p, "x") {
			t.Errorf("node agent: --host-root %q: %s/%s is host path %q, want /%s", hostRoot, hostRoot, p, got, p)
		}
	}
	if lib, ok := arg(c.Args, "nvml-library"); ok && hostPathAt(lib) == "" {
		t.Errorf("node agent: --nvml-library %q is on no host path", lib)
	}
	// Each NVIDIA runtime configuration the GPU isolation check reads is the
	// host's own file, below --host-root, read-only.
	if configs, ok := arg(c.Args, "nvidia-runtime-config"); !ok || configs == "" {
		t.Errorf("node agent: no --nvidia-runtime-config: GPU isolation would not be checked")
	} else {
		for _, p := range strings.Split(configs, ",") {
			got := hostPathAt(path.Join(hostRoot, p))
			v, m := mountOf(spec, path.Join(hostRoot, p))
			if got != p || !m.ReadOnly {
				t.Errorf("node agent: --nvidia-runtime-config %s is host path %q (read-only %v), want itself, read-only", p, got, m.ReadOnly)
				continue
			}
			// Its own mount has no type: a node without the toolkit still
			// starts the agent.
			if strings.HasPrefix(v.Name, "nvidia-runtime-config") && v.HostPath.Type != nil && *v.HostPath.Type != "" {
				t.Errorf("node agent: --nvidia-runtime-config %s: hostPath type %s, want none", p, *v.HostPath.Type)
			}
		}
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Key == "nvidia.com/gpu" && tol.Operator == corev1.TolerationOpExists
	}) {
		t.Errorf("node agent: does not tolerate nvidia.com/gpu taints")
	}
	port := containerPort(spec, intstr.FromString("metrics"))
	if addr, _ := arg(c.Args, "metrics-bind-address"); addr != fmt.Sprintf(":%d", port) {
		t.Errorf("node agent: --metrics-bind-address %q, container port %d", addr, port)
	}

	// The admission policy names the agent's ServiceAccount in its namespace.
	vap := typed[admissionregistrationv1.ValidatingAdmissionPolicy](t, set.get(t, "ValidatingAdmissionPolicy", "", "resclass-node-agent-own-node"))
	user := fmt.Sprintf("system:serviceaccount:%s:%s", agentNS, spec.ServiceAccountName)
	if len(vap.Spec.MatchConditions) == 0 || !strings.Contains(vap.Spec.MatchConditions[0].Expression, `"`+user+`"`) {
		t.Errorf("ValidatingAdmissionPolicy does not match %s: %+v", user, vap.Spec.MatchConditions)
	}
	set.get(t, "ValidatingAdmissionPolicyBinding", "", "resclass-node-agent-own-node")
}

// checkMPSControl checks the MPS control DaemonSet (docs/sharing.md, "Where
// the MPS control daemon runs"): on MPS nodes only, its directories the
// host's same paths as the daemon sees them in its driver root, the node
// agent reading the states it writes, and RBAC to read NodeDevices and write
// Events, nothing more.
func checkMPSControl(t *testing.T, set *objects) {
	t.Helper()
	spec := podSpec(t, set, "DaemonSet", "resclass-mps-control")
	c := spec.Containers[0]
	if spec.NodeSelector["resclass.io/gpu-sharing-mps"] != "true" {
		t.Errorf("MPS control: nodeSelector %v, want resclass.io/gpu-sharing-mps: \"true\" (nodes with a GPU in MPS mode)", spec.NodeSelector)
	}
	if len(c.Args) == 0 || c.Args[0] != "mps-control" {
		t.Errorf("MPS control: args %v, want the subcommand mps-control first", c.Args)
	}
	if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Errorf("MPS control: want privileged (compute modes, the GPUs' device nodes)")
	}
	var nodeName bool
	for _, e := range c.Env {
		nodeName = nodeName || (e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName")
	}
	if !nodeName {
		t.Errorf("MPS control: no NODE_NAME from spec.nodeName")
	}
	// What the chrooted daemon sees at a path is the host's same path: the
	// most specific mount of the file decides.
	root, _ := arg(c.Args, "driver-root")
	hostPathAt := func(file string) (string, bool) {
		var best *corev1.VolumeMount
		for i, m := range c.VolumeMounts {
			if strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") && (best == nil || len(m.MountPath) > len(best.MountPath)) {
				best = &c.VolumeMounts[i]
			}
		}
		if best == nil {
			return "", false
		}
		for _, v := range spec.Volumes {
			if v.Name == best.Name && v.HostPath != nil {
				return path.Join(v.HostPath.Path, strings.TrimPrefix(file, best.MountPath)), best.ReadOnly
			}
		}
		return "", false
	}
	if p, ro := hostPathAt(path.Join(root, "usr/bin/nvidia-cuda-mps-control")); p == "" || !ro {
		t.Errorf("MPS control: --driver-root %q is no host path mounted read-only (%q, read-only %v)", root, p, ro)
	}
	dir, _ := arg(c.Args, "mps-dir")
	for _, p := range []string{path.Join(dir, "GPU-x/state"), path.Join(root, "dev/shm/x")} {
		inRoot := "/" + strings.TrimPrefix(strings.TrimPrefix(p, root), "/")
		want := inRoot
		if strings.HasPrefix(inRoot, "/dev/shm/") {
			want = "/run/resclass/mps/shm/" + strings.TrimPrefix(inRoot, "/dev/shm/")
		}
		if got, ro := hostPathAt(p); got != want || ro || !strings.HasPrefix(p, root+"/") {
			t.Errorf("MPS control: %s is host path %q (read-only %v), want %s, writable, below --driver-root %s", p, got, ro, want, root)
		}
	}
	if got := containerPort(spec, intstr.FromString("metrics")); got == 0 {
		t.Errorf("MPS control: no metrics port")
	} else if addr, _ := arg(c.Args, "metrics-bind-address"); addr != fmt.Sprintf(":%d", got) {
		t.Errorf("MPS control: --metrics-bind-address %q, container port %d", addr, got)
	}

	// The node agent reads the states below its --host-root, read-only.
	agent := podSpec(t, set, "DaemonSet", "resclass-node-agent")
	hostRoot, _ := arg(agent.Containers[0].Args, "host-root")
	if v, m := mountOf(agent, path.Join(hostRoot, "/run/resclass/mps/GPU-x/state")); v == nil || v.HostPath == nil || v.HostPath.Path != "/run/resclass/mps" || !m.ReadOnly {
		t.Errorf("node agent: the MPS states (%s/run/resclass/mps) are not the host's, read-only: %+v", hostRoot, v)
	}

	// RBAC: its NodeDevices, read; Events, written; nothing else.
	role := typed[rbacv1.ClusterRole](t, set.get(t, "ClusterRole", "", "resclass-mps-control"))
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{"resclass.io"}, Resources: []string{"nodedevices"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
	if diff := cmp.Diff(want, role.Rules); diff != "" {
		t.Errorf("ClusterRole resclass-mps-control (-want +got):\n%s", diff)
	}
	binding := typed[rbacv1.ClusterRoleBinding](t, set.get(t, "ClusterRoleBinding", "", "resclass-mps-control"))
	if len(binding.Subjects) != 1 || binding.Subjects[0].Name != spec.ServiceAccountName || binding.Subjects[0].Namespace != agentNS || binding.RoleRef.Name != "resclass-mps-control" {
		t.Errorf("ClusterRoleBinding resclass-mps-control: %+v, want its ServiceAccount %s/%s only", binding, agentNS, spec.ServiceAccountName)
	}
	// Its Events are held to its own Node by the agent's Event policy.
	events := typed[admissionregistrationv1.ValidatingAdmissionPolicy](t, set.get(t, "ValidatingAdmissionPolicy", "", "resclass-node-agent-own-events"))
	if user := fmt.Sprintf("system:serviceaccount:%s:%s", agentNS, spec.ServiceAccountName); !strings.Contains(events.Spec.MatchConditions[0].Expression, `"`+user+`"`) {
		t.Errorf("the Event policy does not match %s: %s", user, events.Spec.MatchConditions[0].Expression)
	}
}

// schedulerConfig decodes the scheduler's --config as kube-scheduler does
// (its scheme: conversion and defaults), and validates it.
func schedulerConfig(t *testing.T, set *objects) *schedulerconfig.KubeSchedulerConfiguration {
	t.Helper()
	spec := podSpec(t, set, "Deployment", "resclass-scheduler")
	file, ok := arg(spec.Containers[0].Args, "config")
	if !ok {
		t.Fatalf("scheduler: no --config")
	}
	data := configMapFile(t, set, spec, file)
	obj, _, err := schedulerscheme.Codecs.UniversalDecoder().Decode([]byte(data), nil, nil)
	if err != nil {
		t.Fatalf("scheduler --config: %v", err)
	}
	cfg, ok := obj.(*schedulerconfig.KubeSchedulerConfiguration)
	if !ok {
		t.Fatalf("scheduler --config: a %T", obj)
	}
	if err := schedulervalidation.ValidateKubeSchedulerConfiguration(cfg); err != nil {
		t.Errorf("scheduler --config: %v", err)
	}
	return cfg
}

func schedulerArgs(t *testing.T, set *objects) *resourceclasses.Args {
	t.Helper()
	cfg := schedulerConfig(t, set)
	for _, pc := range cfg.Profiles[0].PluginConfig {
		if pc.Name == resourceclasses.Name {
			args, err := resourceclasses.DecodeArgs(pc.Args, ns)
			if err != nil {
				t.Fatal(err)
			}
			return args
		}
	}
	t.Fatalf("scheduler: no %s pluginConfig", resourceclasses.Name)
	return nil
}

func checkScheduler(t *testing.T, set *objects) {
	t.Helper()
	cfg := schedulerConfig(t, set)
	if len(cfg.Profiles) != 1 || cfg.Profiles[0].SchedulerName != "resclass-scheduler" {
		t.Errorf("scheduler: profiles %+v, want one, resclass-scheduler", cfg.Profiles)
	}
	le := cfg.LeaderElection
	if !le.LeaderElect || le.ResourceNamespace != ns {
		t.Errorf("scheduler: leaderElection %+v, want leaderElect in %s (2 replicas)", le, ns)
	}
	args := schedulerArgs(t, set)
	if args.StatusLeaseNamespace != ns {
		t.Errorf("scheduler: statusLeaseNamespace %q", args.StatusLeaseNamespace)
	}
	// Its Role allows exactly the Leases the configuration names.
	role := typed[rbacv1.Role](t, set.get(t, "Role", ns, "resclass-scheduler-leases"))
	var names []string
	for _, r := range role.Rules {
		names = append(names, r.ResourceNames...)
	}
	for _, lease := range []string{le.ResourceName, args.StatusLeaseName} {
		if !slices.Contains(names, lease) {
			t.Errorf("scheduler: Role resclass-scheduler-leases does not grant the Lease %s", lease)
		}
	}
	spec := podSpec(t, set, "Deployment", "resclass-scheduler")
	// The admission policies that guard the hand-off name the scheduler's
	// ServiceAccount in this namespace, and each has its binding.
	user := fmt.Sprintf("system:serviceaccount:%s:%s", ns, spec.ServiceAccountName)
	for _, name := range []string{"resclass-assignment-writers", "resclass-scheduler-pod-writes"} {
		vap := typed[admissionregistrationv1.ValidatingAdmissionPolicy](t, set.get(t, "ValidatingAdmissionPolicy", "", name))
		if len(vap.Spec.MatchConditions) == 0 || !strings.Contains(vap.Spec.MatchConditions[0].Expression, `"`+user+`"`) {
			t.Errorf("ValidatingAdmissionPolicy %s does not name %s: %+v", name, user, vap.Spec.MatchConditions)
		}
		if b := typed[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, set.get(t, "ValidatingAdmissionPolicyBinding", "", name)); b.Spec.PolicyName != name || !slices.Equal(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
			t.Errorf("ValidatingAdmissionPolicyBinding %s: %+v, want policy %s with Deny", name, b.Spec, name)
		}
	}
	if p := spec.Containers[0].LivenessProbe; p.HTTPGet.Path != "/healthz" || p.HTTPGet.Scheme != corev1.URISchemeHTTPS || containerPort(spec, p.HTTPGet.Port) != 10259 {
		t.Errorf("scheduler: liveness probe %s, want /healthz over HTTPS on the secure port 10259", p.HTTPGet.Path)
	}
	// Readiness knows the device cache (pkg/scheduler/readiness), which a
	// restart cannot fix: never the liveness probe.
	addr, _ := arg(spec.Containers[0].Args, "resclass-readiness-bind-address")
	if p := spec.Containers[0].ReadinessProbe; p.HTTPGet.Path != "/readyz" || p.HTTPGet.Scheme == corev1.URISchemeHTTPS || addr == "" || fmt.Sprint(":", containerPort(spec, p.HTTPGet.Port)) != addr {
		t.Errorf("scheduler: readiness probe %s on port %s, want /readyz over HTTP on --resclass-readiness-bind-address (%q)", p.HTTPGet.Path, p.HTTPGet.Port.String(), addr)
	}
}

// checkDRAScheduler checks the stock profile's Deployment (scheduler.dra,
// deploy/scheduler/dra): its --config is the one profile resclass-dra with
// NodeAffinity confined to DRA-mode nodes, DRAExtendedResource is on, it
// elects a leader on a Lease of its own that its Role names, and its
// ServiceAccount is bound to upstream's scheduler roles and nothing of
// resclass's.
func checkDRAScheduler(t *testing.T, set *objects) {
	t.Helper()
	spec := podSpec(t, set, "Deployment", "resclass-dra-scheduler")
	c := spec.Containers[0]
	if gates, _ := arg(c.Args, "feature-gates"); gates != "DRAExtendedResource=true" {
		t.Errorf("resclass-dra-scheduler: --feature-gates=%q, want DRAExtendedResource=true (the image turns it off)", gates)
	}
	if c.Image != podSpec(t, set, "Deployment", "resclass-scheduler").Containers[0].Image {
		t.Errorf("resclass-dra-scheduler: image %s is not the resclass scheduler's", c.Image)
	}
	file, ok := arg(c.Args, "config")
	if !ok {
		t.Fatalf("resclass-dra-scheduler: no --config")
	}
	obj, _, err := schedulerscheme.Codecs.UniversalDecoder().Decode([]byte(configMapFile(t, set, spec, file)), nil, nil)
	if err != nil {
		t.Fatalf("resclass-dra-scheduler --config: %v", err)
	}
	cfg := obj.(*schedulerconfig.KubeSchedulerConfiguration)
	if err := schedulervalidation.ValidateKubeSchedulerConfiguration(cfg); err != nil {
		t.Errorf("resclass-dra-scheduler --config: %v", err)
	}
	if len(cfg.Profiles) != 1 || cfg.Profiles[0].SchedulerName != "resclass-dra" {
		t.Fatalf("resclass-dra-scheduler: profiles %+v, want one, resclass-dra", cfg.Profiles)
	}
	var confined bool
	for _, pc := range cfg.Profiles[0].PluginConfig {
		if a, ok := pc.Args.(*schedulerconfig.NodeAffinityArgs); ok && a.AddedAffinity != nil && a.AddedAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
			terms := a.AddedAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
			confined = len(terms) == 1 && len(terms[0].MatchExpressions) == 1 &&
				terms[0].MatchExpressions[0].Key == "node.resclass.io/device-mode" && slices.Equal(terms[0].MatchExpressions[0].Values, []string{"dra"})
		}
	}
	if !confined {
		t.Errorf("resclass-dra-scheduler: the profile is not confined to node.resclass.io/device-mode=dra: %+v", cfg.Profiles[0].PluginConfig)
	}
	// Upstream's default plugins as defaulting fills them in: none disabled,
	// and not resclass's.
	if p := cfg.Profiles[0].Plugins; p == nil || len(p.MultiPoint.Disabled) > 0 ||
		slices.ContainsFunc(p.MultiPoint.Enabled, func(e schedulerconfig.Plugin) bool { return e.Name == resourceclasses.Name }) ||
		!slices.ContainsFunc(p.MultiPoint.Enabled, func(e schedulerconfig.Plugin) bool { return e.Name == "DynamicResources" }) {
		t.Errorf("resclass-dra-scheduler: plugins %+v, want upstream's defaults, DynamicResources among them", p)
	}
	le := cfg.LeaderElection
	if !le.LeaderElect || le.ResourceNamespace != ns || le.ResourceName != "resclass-dra-scheduler" {
		t.Errorf("resclass-dra-scheduler: leaderElection %+v, want the Lease %s/resclass-dra-scheduler", le, ns)
	}
	role := typed[rbacv1.Role](t, set.get(t, "Role", ns, "resclass-dra-scheduler-leases"))
	for _, r := range role.Rules {
		if !slices.Equal(r.Verbs, []string{"create"}) && !slices.Equal(r.ResourceNames, []string{le.ResourceName}) {
			t.Errorf("resclass-dra-scheduler-leases: %v on Leases %v, want only its own Lease %s", r.Verbs, r.ResourceNames, le.ResourceName)
		}
	}
	// Bound to the built-in scheduler roles, the auth reader and its Lease
	// Role: no resclass ClusterRole.
	var roles []string
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		for _, o := range set.kind(kind) {
			b := typed[rbacv1.ClusterRoleBinding](t, o)
			if slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool { return s.Name == spec.ServiceAccountName && s.Namespace == ns }) {
				roles = append(roles, b.RoleRef.Kind+"/"+b.RoleRef.Name)
			}
		}
	}
	slices.Sort(roles)
	if want := []string{"ClusterRole/system:kube-scheduler", "ClusterRole/system:volume-scheduler", "Role/extension-apiserver-authentication-reader", "Role/resclass-dra-scheduler-leases"}; !slices.Equal(roles, want) {
		t.Errorf("ServiceAccount %s is bound to %v, want %v", spec.ServiceAccountName, roles, want)
	}
}

func checkWebhook(t *testing.T, set *objects) {
	t.Helper()
	spec := podSpec(t, set, "Deployment", "resclass-webhook")
	c := spec.Containers[0]
	var podNamespace bool
	for _, e := range c.Env {
		podNamespace = podNamespace || (e.Name == "POD_NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace")
	}
	if !podNamespace {
		t.Errorf("webhook: no POD_NAMESPACE")
	}

	// The apiserver reaches every webhook through the Service, on the
	// container's --webhook-port.
	webhookPort := int32(9443)
	if _, ok := arg(c.Args, "webhook-port"); ok {
		t.Errorf("webhook: --webhook-port is set; this test assumes the default 9443")
	}
	vwc := typed[admissionregistrationv1.ValidatingWebhookConfiguration](t, set.get(t, "ValidatingWebhookConfiguration", "", "resclass-webhook"))
	if len(vwc.Webhooks) == 0 {
		t.Errorf("webhook: the configuration has no webhooks")
	}
	for _, wh := range vwc.Webhooks {
		ref := wh.ClientConfig.Service
		if ref == nil {
			t.Errorf("webhook %s: no clientConfig.service", wh.Name)
			continue
		}
		svcObj := set.find("Service", ref.Namespace, ref.Name)
		if svcObj == nil {
			t.Errorf("webhook %s: Service %s/%s is not rendered", wh.Name, ref.Namespace, ref.Name)
			continue
		}
		svc := typed[corev1.Service](t, svcObj)
		port := int32(443)
		if ref.Port != nil {
			port = *ref.Port
		}
		i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == port })
		if i < 0 || containerPort(spec, svc.Spec.Ports[i].TargetPort) != webhookPort {
			t.Errorf("webhook %s: Service %s port %d does not lead to container port %d", wh.Name, ref.Name, port, webhookPort)
		}
		if svc.Spec.ClusterIP == corev1.ClusterIPNone {
			t.Errorf("webhook: Service %s is headless; the apiserver needs a ClusterIP", ref.Name)
		}
		if wh.NamespaceSelector != nil && !slices.ContainsFunc(wh.NamespaceSelector.MatchExpressions, func(r metav1.LabelSelectorRequirement) bool {
			return r.Key == "kubernetes.io/metadata.name" && r.Operator == "NotIn" && slices.Contains(r.Values, ns)
		}) {
			t.Errorf("webhook %s: its own namespace %s is not excluded", wh.Name, ns)
		}
	}
	// The mutating webhook (a ResourceDistribution's author) is served by
	// the same Service.
	mwc := typed[admissionregistrationv1.MutatingWebhookConfiguration](t, set.get(t, "MutatingWebhookConfiguration", "", "resclass-webhook"))
	for _, wh := range mwc.Webhooks {
		if ref := wh.ClientConfig.Service; ref == nil || ref.Name != "resclass-webhook" || ref.Namespace != ns || ref.Path == nil || !strings.HasPrefix(*ref.Path, "/mutate-") {
			t.Errorf("mutating webhook %s: clientConfig %+v, want the Service resclass-webhook, a /mutate- path", wh.Name, wh.ClientConfig)
		}
	}
	if set.find("Secret", ns, "resclass-webhook-tls") == nil && set.find("Certificate", ns, "resclass-webhook") == nil {
		t.Errorf("webhook: neither the Secret resclass-webhook-tls nor a Certificate for it")
	}
	// The serving certificate is the Secret mounted, its tls.crt and tls.key
	// only: the webhook's identity cannot read it, and the CA key stays out.
	dir, _ := arg(c.Args, "cert-dir")
	if v, _ := mountedFile(spec, path.Join(dir, "tls.crt")); v == nil || v.Secret == nil || v.Secret.SecretName != "resclass-webhook-tls" {
		t.Errorf("webhook: --cert-dir %q is not the Secret resclass-webhook-tls mounted", dir)
	} else {
		var keys []string
		for _, it := range v.Secret.Items {
			keys = append(keys, it.Key+"="+it.Path)
		}
		if !slices.Equal(keys, []string{"tls.crt=tls.crt", "tls.key=tls.key"}) {
			t.Errorf("webhook: the Secret volume projects %v, want tls.crt and tls.key only", keys)
		}
	}
	if file, ok := arg(c.Args, "quota-config"); ok {
		if _, err := quota.Parse([]byte(configMapFile(t, set, spec, file))); err != nil {
			t.Errorf("webhook --quota-config: %v", err)
		}
	}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		if containerPort(spec, p.HTTPGet.Port) != 8081 {
			t.Errorf("webhook: probe %s not on --health-probe-bind-address :8081", p.HTTPGet.Path)
		}
	}
	// The pod webhook fails closed: more than one replica must mean more
	// than one node (a required spread or anti-affinity by hostname), and a
	// PodDisruptionBudget keeps a drain from taking them all.
	d := typed[appsv1.Deployment](t, set.get(t, "Deployment", ns, "resclass-webhook"))
	podLabels := d.Spec.Template.Labels
	if d.Spec.Replicas != nil && *d.Spec.Replicas > 1 {
		spread := slices.ContainsFunc(spec.TopologySpreadConstraints, func(c corev1.TopologySpreadConstraint) bool {
			return c.TopologyKey == corev1.LabelHostname && c.WhenUnsatisfiable == corev1.DoNotSchedule && c.MaxSkew == 1 &&
				c.LabelSelector != nil && len(c.LabelSelector.MatchLabels) > 0 && labelsMatch(c.LabelSelector.MatchLabels, podLabels)
		})
		if a := spec.Affinity; !spread && a != nil && a.PodAntiAffinity != nil {
			spread = slices.ContainsFunc(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution, func(term corev1.PodAffinityTerm) bool {
				return term.TopologyKey == corev1.LabelHostname && term.LabelSelector != nil && len(term.LabelSelector.MatchLabels) > 0 &&
					labelsMatch(term.LabelSelector.MatchLabels, podLabels)
			})
		}
		if !spread {
			t.Errorf("webhook: %d replicas with no required spread over nodes (topologySpreadConstraints DoNotSchedule or required anti-affinity by %s)", *d.Spec.Replicas, corev1.LabelHostname)
		}
		if !slices.ContainsFunc(set.kind("PodDisruptionBudget"), func(o *unstructured.Unstructured) bool {
			sel, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
			return o.GetNamespace() == ns && len(sel) > 0 && labelsMatch(sel, podLabels)
		}) {
			t.Errorf("webhook: no PodDisruptionBudget selects its pods")
		}
	}
}

// helmLabels are the labels only the chart sets.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}

var hashSuffix = regexp.MustCompile(`^(resclass-scheduler-config|resclass-dra-scheduler-config)-[a-z0-9]{10}$`)

// normalize removes what legitimately differs between the chart and the
// kustomize base: Helm's labels, the content-hash suffix kustomize gives the
// schedulers' ConfigMaps (the chart rolls the pods by a checksum annotation
// instead), the formatting of configuration files in ConfigMaps, and blank
// lines in multi-line strings: kustomize's YAML round trip re-folds a folded
// scalar (>-) with more-indented lines so that it reads back with an extra
// blank line before them. Only the CEL expressions of the admission policy
// and the webhook configuration are written so, and CEL ignores whitespace.
func normalize(t *testing.T, o *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	o = o.DeepCopy()
	labels := o.GetLabels()
	for _, l := range helmLabels {
		delete(labels, l)
	}
	o.SetLabels(labels)
	if len(labels) == 0 {
		unstructured.RemoveNestedField(o.Object, "metadata", "labels")
	}
	o.SetName(hashSuffix.ReplaceAllString(o.GetName(), "$1"))
	if o.GetKind() == "Deployment" || o.GetKind() == "DaemonSet" {
		unstructured.RemoveNestedField(o.Object, "spec", "template", "metadata", "annotations", "checksum/config")
		if a, _, _ := unstructured.NestedMap(o.Object, "spec", "template", "metadata", "annotations"); len(a) == 0 {
			unstructured.RemoveNestedField(o.Object, "spec", "template", "metadata", "annotations")
		}
		volumes, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "volumes")
		for _, v := range volumes {
			if cm, ok := v.(map[string]any)["configMap"].(map[string]any); ok {
				cm["name"] = hashSuffix.ReplaceAllString(cm["name"].(string), "$1")
			}
		}
		_ = unstructured.SetNestedSlice(o.Object, volumes, "spec", "template", "spec", "volumes")
	}
	o.Object = collapseBlankLines(o.Object).(map[string]any)
	if o.GetKind() == "ConfigMap" {
		data, _, _ := unstructured.NestedStringMap(o.Object, "data")
		parsed := map[string]any{}
		for k, v := range data {
			var doc any
			if err := yaml.Unmarshal([]byte(v), &doc); err != nil {
				t.Fatalf("%s data %s: %v", key(o), k, err)
			}
			parsed[k] = doc
		}
		o.Object["data"] = parsed
	}
	return o
}

// TestDockerfile checks the Dockerfile without a Docker engine: the three
// targets exist, every base image is one of the known tags, each target's
// binary comes from a go build of its ./cmd package, and each runs as the
// user it should.
func TestDockerfile(t *testing.T) {
	root, err := install.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := goDirective(t, filepath.Join(root, "go.mod"))
	golang := "golang:" + goVersion + "-bookworm"
	known := map[string]bool{
		golang: true,
		"gcr.io/distroless/base-debian12:nonroot":   true,
		"gcr.io/distroless/static-debian12:nonroot": true,
	}
	stages := parseDockerfile(t, data)
	byName := map[string]*stage{}
	for _, s := range stages {
		if s.name != "" {
			byName[s.name] = s
		}
		if byName[s.from] == nil && !known[s.from] {
			t.Errorf("FROM %s: not a known base image (want one of %v; the builder's Go is go.mod's %s)", s.from, slices.Sorted(maps.Keys(known)), goVersion)
		}
	}
	// build follows FROM <stage> back to the stage a RUN builds binary in.
	for target, want := range map[string]struct{ base, user, cgo string }{
		"node-agent": {"gcr.io/distroless/base-debian12:nonroot", "0:0", "CGO_ENABLED=1"},
		"scheduler":  {"gcr.io/distroless/static-debian12:nonroot", "65532:65532", "CGO_ENABLED=0"},
		"webhook":    {"gcr.io/distroless/static-debian12:nonroot", "65532:65532", "CGO_ENABLED=0"},
	} {
		s := byName[target]
		if s == nil {
			t.Errorf("no target %s", target)
			continue
		}
		if s.from != want.base {
			t.Errorf("%s: FROM %s, want %s", target, s.from, want.base)
		}
		if s.user != want.user {
			t.Errorf("%s: USER %q, want %q", target, s.user, want.user)
		}
		if len(s.entrypoint) == 0 {
			t.Errorf("%s: no ENTRYPOINT", target)
		}
		// The binary the entrypoint runs is copied from a build stage.
		var from, src string
		for _, c := range s.copies {
			if c.dst == s.entrypoint {
				from, src = c.from, c.src
			}
		}
		build := byName[from]
		if build == nil {
			t.Errorf("%s: ENTRYPOINT %s is not copied from a build stage", target, s.entrypoint)
			continue
		}
		var run string
		for _, r := range build.runs {
			if strings.Contains(r, "go build") && strings.Contains(r, "-o "+src) {
				run = r
			}
		}
		if run == "" {
			t.Errorf("%s: stage %s has no go build -o %s", target, from, src)
			continue
		}
		// -tags grpcnotrace: without it gRPC links golang.org/x/net/trace,
		// and the linker keeps every exported method (the Dockerfile says why).
		for _, w := range []string{" ./cmd/" + target, "-trimpath", "-tags grpcnotrace", want.cgo, "--mount=type=cache,target=/go/pkg/mod", "--mount=type=cache,target=/root/.cache/go-build"} {
			if !strings.Contains(run, w) {
				t.Errorf("%s: the go build does not have %q: %s", target, w, run)
			}
		}
		if target == "scheduler" && !strings.Contains(run, "k8s.io/component-base/version.gitVersion=") {
			t.Errorf("scheduler: built without the Makefile's K8S_VERSION_LDFLAGS: %s", run)
		}
	}

	ignore, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{".git", "_output", "bin"} {
		if !slices.Contains(strings.Fields(string(ignore)), p) {
			t.Errorf(".dockerignore does not exclude %s", p)
		}
	}
}

// TestMakeImages checks that `make images` builds each target with its tag.
func TestMakeImages(t *testing.T) {
	root, err := install.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, filepath.Join(root, "Makefile")) // for go test's cache: make reads it
	cmd := exec.Command("make", "-n", "images", "REGISTRY=registry.example/team", "TAG=v9")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make -n images: %v\n%s", err, out)
	}
	for _, target := range []string{"node-agent", "scheduler", "webhook"} {
		want := fmt.Sprintf("docker buildx build --target %s -t registry.example/team/resclass-%s:v9 .", target, target)
		if !strings.Contains(string(out), want) {
			t.Errorf("make -n images does not run %q:\n%s", want, out)
		}
	}
}

type copyInstr struct{ from, src, dst string }

type stage struct {
	from, name, user, entrypoint string
	runs                         []string
	copies                       []copyInstr
}

// parseDockerfile reads the instructions this test checks (FROM, USER, RUN,
// COPY, ENTRYPOINT), with line continuations joined and comments left out.
// It is no full Dockerfile parser: a construct it does not know fails.
func parseDockerfile(t *testing.T, data []byte) []*stage {
	t.Helper()
	var stages []*stage
	var logical []string
	var cur strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if l, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(l + " ")
			continue
		}
		cur.WriteString(line)
		logical = append(logical, cur.String())
		cur.Reset()
	}
	for _, l := range logical {
		f := strings.Fields(l)
		instr, rest := strings.ToUpper(f[0]), f[1:]
		if instr == "FROM" {
			s := &stage{}
			for len(rest) > 0 && strings.HasPrefix(rest[0], "--") {
				rest = rest[1:]
			}
			switch {
			case len(rest) == 1:
				s.from = rest[0]
			case len(rest) == 3 && strings.EqualFold(rest[1], "AS"):
				s.from, s.name = rest[0], rest[2]
			default:
				t.Fatalf("Dockerfile: cannot read %q", l)
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) == 0 {
			t.Fatalf("Dockerfile: %q before the first FROM", l)
		}
		s := stages[len(stages)-1]
		switch instr {
		case "RUN":
			s.runs = append(s.runs, strings.Join(rest, " "))
		case "USER":
			s.user = rest[0]
		case "COPY":
			c := copyInstr{}
			for len(rest) > 0 && strings.HasPrefix(rest[0], "--") {
				if v, ok := strings.CutPrefix(rest[0], "--from="); ok {
					c.from = v
				}
				rest = rest[1:]
			}
			if len(rest) == 2 {
				c.src, c.dst = rest[0], rest[1]
			}
			s.copies = append(s.copies, c)
		case "ENTRYPOINT":
			var argv []string
			if err := yaml.Unmarshal([]byte(strings.Join(rest, " ")), &argv); err != nil || len(argv) == 0 {
				t.Fatalf("Dockerfile: ENTRYPOINT %q is not an exec-form array", l)
			}
			s.entrypoint = argv[0]
		case "WORKDIR", "ARG", "ENV", "LABEL":
		default:
			t.Fatalf("Dockerfile: this test does not know %s (%q): teach parseDockerfile", instr, l)
		}
	}
	return stages
}

// goDirective is go.mod's go version as major.minor (the golang image tag).
func goDirective(t *testing.T, gomod string) string {
	t.Helper()
	data, err := os.ReadFile(gomod)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("%s: no go directive", gomod)
	}
	return string(m[1])
}

// collapseBlankLines removes the blank lines of every multi-line string in v.
func collapseBlankLines(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = collapseBlankLines(e)
		}
	case []any:
		for i, e := range v {
			v[i] = collapseBlankLines(e)
		}
	case string:
		if strings.Contains(v, "\n\n") {
			lines := strings.Split(v, "\n")
			return strings.Join(slices.DeleteFunc(lines, func(l string) bool { return strings.TrimSpace(l) == "" }), "\n")
		}
	}
	return v
}

// readAll reads every file below root (or root itself): go test caches a
// result until a file the test process opened changes, and the files helm and
// make read in their own processes would otherwise not count.
func readAll(t *testing.T, root string) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		_, err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
