package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/mig"
)

// The plugin's -o json/yaml, as a script reads it. (The test does not import
// pkg/kubectlplugin: cli-runtime links kustomize, whose use of Go's plugin
// package would make this binary, which links go-nvml, bind NVML at start.)
type explanation struct {
	Nodes []struct {
		Node                    string
		Selected, Healthy, Free int
		Devices                 []struct {
			ID, Kind    string
			Selected    bool
			NotSelected []string
			Healthy     bool
			HeldBy      []string
		}
	}
}

type classCapacity struct {
	Class                   string
	Allocatable, Held, Free int64
	Nodes                   []nodeCapacity
}

type nodeCapacity struct {
	Node                    string
	Allocatable, Held, Free int64
}

// kubectlResclass runs the built plugin (_output/bin/kubectl-resclass, as an
// operator runs it through kubectl) with the cluster's kubeconfig,
// impersonating user with kubectl's --as: what the apiserver authorizes is
// that user's RBAC.
func kubectlResclass(t *testing.T, ctx context.Context, user string, args ...string) (string, error) {
	t.Helper()
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "_output", "bin", "kubectl-resclass")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: run `make e2e-binaries`", err)
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig=" + cluster.Kubeconfig, "--as=" + user, "--as-group=system:authenticated"}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	if err != nil {
		return out.String() + errOut.String(), err
	}
	return out.String(), nil
}

// viewer is a user holding only the view ClusterRole, bound cluster-wide:
// resclass's kinds reach it through the aggregated resclass-view role
// (deploy/roles), which the harness installs as shipped.
func viewer(t *testing.T, ctx context.Context) string {
	t.Helper()
	const user = "e2e-viewer"
	_, err := cluster.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: user, APIGroup: rbacv1.GroupName}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), user, metav1.DeleteOptions{})
	})
	// view reads resourceclasses and nodedevices once the aggregation
	// controller folded resclass-view in, and never resourcedistributions
	// (they carry Secrets) nor writes anything.
	for _, c := range []struct {
		verb, resource string
		want           bool
	}{
		{"list", "resourceclasses", true}, {"list", "nodedevices", true},
		{"list", "resourcedistributions", false}, {"create", "resourceclasses", false},
	} {
		attrs := &authorizationv1.ResourceAttributes{Verb: c.verb, Group: v1alpha1.GroupName, Resource: c.resource}
		poll(t, ctx, time.Minute, "view: "+c.verb+" "+c.resource, func(ctx context.Context) (bool, error) {
			r, err := cluster.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: user, Groups: []string{"system:authenticated"}, ResourceAttributes: attrs,
			}}, metav1.CreateOptions{})
			return err == nil && r.Status.Allowed == c.want, err
		})
	}
	return user
}

// TestKubectlResclass runs every subcommand of the plugin as a user with
// view rights only, against a node with one healthy and one unhealthy T4, a
// pod holding the healthy one and a second pod Pending for it.
func TestKubectlResclass(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	const pool, class = "kubectl-resclass", "kr-gpu"
	nodes, err := cluster.AddSimulatedNodes(ctx, framework.SimulatedNodes{Prefix: "kr-t4", Count: 1, Profile: "t4-inference", Labels: map[string]string{"pool": pool}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNodes(nodes) })
	node := nodes[0]
	schedClass(t, ctx, class, req("kind", v1alpha1.ResourceSelectorOpIn, "nvidia-gpu"))
	ns := newNamespace(t, ctx, nil)
	pods := cluster.Client.CoreV1().Pods(ns)
	if _, err := pods.Create(ctx, schedPod(ns, "holder", pool, map[string]int64{class: 1}, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	boundAssignment(t, ctx, ns, "holder")
	if _, err := pods.Create(ctx, schedPod(ns, "waiter", pool, map[string]int64{class: 1}, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEventOn(t, ctx, ns, "Pod", "waiter", "FailedScheduling", "Insufficient free devices of class "+class)
	user := viewer(t, ctx)

	t.Run("explain", func(t *testing.T) {
		out, err := kubectlResclass(t, ctx, user, "explain", class, "--node", node, "-o", "json")
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		var e explanation
		if err := json.Unmarshal([]byte(out), &e); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if len(e.Nodes) != 1 || e.Nodes[0].Node != node || e.Nodes[0].Selected != 2 || e.Nodes[0].Healthy != 1 || e.Nodes[0].Free != 0 {
			t.Fatalf("explain %s --node %s: %s\nwant 2 selected, 1 healthy, 0 free", class, node, out)
		}
		for _, d := range e.Nodes[0].Devices {
			switch {
			case d.Kind == "nvidia-gpu" && d.Healthy && !slices.Equal(d.HeldBy, []string{ns + "/holder"}):
				t.Errorf("the healthy T4 is held by %v, want %s/holder", d.HeldBy, ns)
			case d.Kind == "nic" && (d.Selected || !strings.Contains(strings.Join(d.NotSelected, ";"), `kind is "nic", not In nvidia-gpu`)):
				t.Errorf("the NIC: %+v, want not selected because of its kind", d)
			}
		}
		table, err := kubectlResclass(t, ctx, user, "explain", class, "--node", node)
		if err != nil {
			t.Fatalf("%v: %s", err, table)
		}
		t.Logf("kubectl resclass explain %s --node %s:\n%s", class, node, table)
		for _, want := range []string{"held", "by " + ns + "/holder", "unhealthy", "not-selected", `kind is "nic", not In nvidia-gpu`} {
			if !strings.Contains(table, want) {
				t.Errorf("explain's table lacks %q:\n%s", want, table)
			}
		}
	})

	t.Run("capacity", func(t *testing.T) {
		out, err := kubectlResclass(t, ctx, user, "capacity", "--nodes", "-o", "yaml")
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		var caps []classCapacity
		if err := yaml.Unmarshal([]byte(out), &caps); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		i := slices.IndexFunc(caps, func(c classCapacity) bool { return c.Class == class })
		if i < 0 {
			t.Fatalf("capacity lacks %s: %s", class, out)
		}
		j := slices.IndexFunc(caps[i].Nodes, func(n nodeCapacity) bool { return n.Node == node })
		if j < 0 || caps[i].Nodes[j] != (nodeCapacity{Node: node, Allocatable: 1, Held: 1, Free: 0}) {
			t.Errorf("capacity of %s: %+v, want on %s 1 allocatable, 1 held, 0 free", class, caps[i], node)
		}
		table, err := kubectlResclass(t, ctx, user, "capacity")
		if err != nil || !strings.Contains(table, "CLASS") || !strings.Contains(table, class) {
			t.Errorf("capacity's table: %v\n%s", err, table)
		}
	})

	t.Run("why-pending", func(t *testing.T) {
		out, err := kubectlResclass(t, ctx, user, "why-pending", "waiter", "-n", ns)
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		t.Logf("kubectl resclass why-pending waiter:\n%s", out)
		line := ""
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, node+" ") {
				line = l
			}
		}
		// The node's row names the class and its shortage, in the
		// scheduler's words, with the class's free devices there.
		for _, want := range []string{"no", class + "=0/1", "Insufficient free devices of class " + class} {
			if !strings.Contains(line, want) {
				t.Errorf("why-pending's row for %s lacks %q: %q\n%s", node, want, line, out)
			}
		}
		for _, want := range []string{"Requests:", class + "=1", "FailedScheduling", "Nodes cannot be read"} {
			if !strings.Contains(out, want) {
				t.Errorf("why-pending lacks %q:\n%s", want, out)
			}
		}
		held, err := kubectlResclass(t, ctx, user, "why-pending", "holder", "-n", ns)
		if err != nil || !strings.Contains(held, "the pod is bound to node "+node) {
			t.Errorf("why-pending of a bound pod: %v\n%s", err, held)
		}
	})

	t.Run("preview", func(t *testing.T) {
		dir := t.TempDir()
		file := filepath.Join(dir, "class.yaml")
		if err := os.WriteFile(file, []byte(`apiVersion: resclass.io/v1alpha1
kind: ResourceClass
metadata:
  name: kr-preview-fast-nics
spec:
  resourceSelector:
  - matchExpressions:
    - {key: kind, operator: In, values: [nic]}
    - {key: speed, operator: GtEq, values: [100Gbps]}
`), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := kubectlResclass(t, ctx, user, "preview", "-f", file, "--node", node)
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		// The T4 node's NIC is 25Gbps.
		for _, want := range []string{"speed is 25Gbps, not GtEq 100Gbps", `kind is "nvidia-gpu", not In nic`} {
			if !strings.Contains(out, want) {
				t.Errorf("preview lacks %q:\n%s", want, out)
			}
		}
		rc, err := cluster.Resclass()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rc.ResclassV1alpha1().ResourceClasses().Get(ctx, "kr-preview-fast-nics", metav1.GetOptions{}); err == nil {
			t.Error("preview created the class")
		}
		if err := os.WriteFile(file, []byte("apiVersion: resclass.io/v1alpha1\nkind: ResourceClass\nmetadata: {name: bad}\nspec: {resourceSelector: [{matchExpressions: [{key: memory, operator: GtEq, values: [lots]}]}]}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := kubectlResclass(t, ctx, user, "preview", "-f", file); err == nil || !strings.Contains(out, "spec.resourceSelector[0].matchExpressions[0].values[0]") {
			t.Errorf("preview of an invalid class: %v, want a refusal naming the field:\n%s", err, out)
		}
	})

	t.Run("mig", func(t *testing.T) {
		// A NodeDevices as an agent publishes one for a GPU in MIG mode: the
		// A100-40GB's profiles, a 3g.20gb at slice 4.
		const migNode = "kr-mig"
		geometry := mig.A100_40GB.API(v1alpha1.MIGInstance{Profile: "3g.20gb", Start: 4})
		rc, err := cluster.Resclass()
		if err != nil {
			t.Fatal(err)
		}
		nd, err := rc.ResclassV1alpha1().NodeDevices().Create(ctx, &v1alpha1.NodeDevices{ObjectMeta: metav1.ObjectMeta{Name: migNode}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = rc.ResclassV1alpha1().NodeDevices().Delete(context.Background(), migNode, metav1.DeleteOptions{})
		})
		nd.Status.Devices = []v1alpha1.Device{{ID: "GPU-kr-mig", Kind: v1alpha1.DeviceKindNvidiaGPU, Healthy: true, MIG: geometry,
			Attributes: map[string]v1alpha1.DeviceAttribute{v1alpha1.AttributeProduct: v1alpha1.StringAttribute(mig.A100_40GB.Product)}}}
		if _, err := rc.ResclassV1alpha1().NodeDevices().UpdateStatus(ctx, nd, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		out, err := kubectlResclass(t, ctx, user, "mig", "--node", migNode, "-o", "json")
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		var gpus []struct {
			GPU        string   `json:"gpu"`
			Instances  []string `json:"instances"`
			FreeSlices int      `json:"freeSlices"`
			Largest    string   `json:"largest"`
		}
		if err := json.Unmarshal([]byte(out), &gpus); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if len(gpus) != 1 || gpus[0].GPU != "GPU-kr-mig" || strings.Join(gpus[0].Instances, ",") != "3g.20gb@4" || gpus[0].FreeSlices != 4 || gpus[0].Largest != "4g.20gb" {
			t.Errorf("mig --node %s: %s", migNode, out)
		}
		table, err := kubectlResclass(t, ctx, user, "mig")
		if err != nil || !strings.Contains(table, "GPU-kr-mig") || strings.Contains(table, node) {
			t.Errorf("mig: %v, want the MIG GPU and not the T4 node:\n%s", err, table)
		}
	})

	t.Run("without view", func(t *testing.T) {
		out, err := kubectlResclass(t, ctx, "e2e-nobody", "capacity")
		if err == nil || !strings.Contains(out, "forbidden") || !strings.Contains(out, "the view ClusterRole") {
			t.Errorf("capacity without rights: %v, want a refusal saying which role to bind:\n%s", err, out)
		}
	})
}

// TestShortNames: kubectl resolves each resclass short name to its kind and
// no other resource the apiserver serves claims it; the short names dropped
// for colliding stay taken by others (rc is ReplicationController's).
func TestShortNames(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	dc, err := discovery.NewDiscoveryClientForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	_, lists, err := dc.ServerGroupsAndResources()
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string][]string{}
	for _, l := range lists {
		for _, r := range l.APIResources {
			for _, s := range r.ShortNames {
				owners[s] = append(owners[s], r.Name+"."+l.GroupVersion)
			}
		}
	}
	for short, want := range map[string]string{
		"rsclass": "resourceclasses.resclass.io/v1alpha1",
		"nodedev": "nodedevices.resclass.io/v1alpha1",
		"rsdist":  "resourcedistributions.resclass.io/v1alpha1",
		"rc":      "replicationcontrollers.v1",
	} {
		if !slices.Equal(owners[short], []string{want}) {
			t.Errorf("short name %s is claimed by %v, want only %s", short, owners[short], want)
		}
	}
	for _, dropped := range []string{"rd", "distributor", "rclass", "nd"} {
		for _, o := range owners[dropped] {
			if strings.Contains(o, "resclass.io") {
				t.Errorf("%s still claims the short name %s", o, dropped)
			}
		}
	}
	// As kubectl expands them.
	mapper := restmapper.NewShortcutExpander(restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), dc, nil)
	for short, want := range map[string]string{"rsclass": "resourceclasses", "nodedev": "nodedevices", "rsdist": "resourcedistributions"} {
		gvr, err := mapper.ResourceFor(schema.GroupVersionResource{Resource: short})
		if err != nil || gvr.Group != v1alpha1.GroupName || gvr.Resource != want {
			t.Errorf("kubectl get %s: %v, %v; want %s.%s", short, gvr, err, want, v1alpha1.GroupName)
		}
	}
}
