package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/dra"
)

// deviceClassOf waits until the DeviceClass of rc is exactly what dra.DeviceClass
// says (the real apiserver has then also accepted its CEL and its
// extendedResourceName) and the class's DeviceClass condition is True.
func deviceClassOf(t *testing.T, ctx context.Context, rc *v1alpha1.ResourceClass) *resourceapi.DeviceClass {
	t.Helper()
	want, err := dra.DeviceClass(rc)
	if err != nil {
		t.Fatal(err)
	}
	var got *resourceapi.DeviceClass
	poll(t, ctx, 30*time.Second, "DeviceClass "+rc.Name+" as translated", func(ctx context.Context) (bool, error) {
		got, err = cluster.Client.ResourceV1().DeviceClasses().Get(ctx, rc.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		ref := metav1.GetControllerOf(got)
		return ref != nil && ref.UID == rc.UID && ref.Kind == "ResourceClass" &&
			len(got.Spec.Selectors) == 1 && got.Spec.Selectors[0].CEL != nil &&
			got.Spec.Selectors[0].CEL.Expression == want.Spec.Selectors[0].CEL.Expression &&
			got.Spec.ExtendedResourceName != nil && *got.Spec.ExtendedResourceName == "class.resclass.io/"+rc.Name &&
			got.Labels[dra.ManagedByLabel] == dra.ManagedByValue, nil
	})
	waitCondition(t, ctx, rc.Name, metav1.ConditionTrue, dra.ReasonSynced)
	return got
}

func waitCondition(t *testing.T, ctx context.Context, class string, status metav1.ConditionStatus, reason string) *metav1.Condition {
	t.Helper()
	rcs, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	var cond *metav1.Condition
	poll(t, ctx, 30*time.Second, "condition DeviceClass="+string(status)+" ("+reason+") on "+class, func(ctx context.Context) (bool, error) {
		rc, err := rcs.ResclassV1alpha1().ResourceClasses().Get(ctx, class, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		cond = meta.FindStatusCondition(rc.Status.Conditions, dra.ConditionDeviceClass)
		return cond != nil && cond.Status == status && cond.Reason == reason, nil
	})
	return cond
}

func createClass(t *testing.T, ctx context.Context, name string, selectors ...[]v1alpha1.ResourceSelectorRequirement) *v1alpha1.ResourceClass {
	t.Helper()
	var spec v1alpha1.ResourceClassSpec
	for _, exprs := range selectors {
		spec.ResourceSelector = append(spec.ResourceSelector, v1alpha1.ResourcePropertySelector{MatchExpressions: exprs})
	}
	return createClassSpec(t, ctx, name, spec)
}

func deleteClassAndWaitGone(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	rcs, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	if err := rcs.ResclassV1alpha1().ResourceClasses().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, 30*time.Second, "DeviceClass "+name+" deleted with its class", func(ctx context.Context) (bool, error) {
		_, err := cluster.Client.ResourceV1().DeviceClasses().Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// TestDeviceClassFollowsResourceClass: the scheduler (as its ServiceAccount,
// with deploy/scheduler's RBAC) keeps a DeviceClass per ResourceClass on the
// real apiserver: created with the translated CEL and extendedResourceName
// class.resclass.io/<class>, restored after a hand edit, replaced when the
// class is recreated with another selector, deleted with the class.
func TestDeviceClassFollowsResourceClass(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	const name = "dra.fast.nic"
	rc := createClass(t, ctx, name, []v1alpha1.ResourceSelectorRequirement{
		req("Kind", v1alpha1.ResourceSelectorOpIn, "nic"), req("speed", v1alpha1.ResourceSelectorOpGtEq, "40GBPS"),
	})
	dc := deviceClassOf(t, ctx, rc)
	if !strings.Contains(dc.Spec.Selectors[0].CEL.Expression, `c["speed"].compareTo(quantity("40G")) >= 0`) {
		t.Errorf("the DeviceClass's CEL does not compare the speed capacity: %s", dc.Spec.Selectors[0].CEL.Expression)
	}

	// A hand edit of what resclass manages is undone; what it does not manage
	// (a label) is kept.
	edited := dc.DeepCopy()
	edited.Spec.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: "true"}}}
	edited.Spec.ExtendedResourceName = nil
	edited.Labels["team"] = "infra"
	if _, err := cluster.Client.ResourceV1().DeviceClasses().Update(ctx, edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	restored := deviceClassOf(t, ctx, rc)
	if restored.Labels["team"] != "infra" {
		t.Errorf("the controller removed a label it does not manage: %v", restored.Labels)
	}

	// Deleting the DeviceClass by hand brings it back.
	if err := cluster.Client.ResourceV1().DeviceClasses().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deviceClassOf(t, ctx, rc)

	// The spec is immutable: a changed class is a new class of the same name.
	deleteClassAndWaitGone(t, ctx, name)
	rc2 := createClass(t, ctx, name, []v1alpha1.ResourceSelectorRequirement{
		req("kind", v1alpha1.ResourceSelectorOpIn, "nic"), req("speed", v1alpha1.ResourceSelectorOpGtEq, "100Gbps"),
	})
	dc2 := deviceClassOf(t, ctx, rc2)
	if dc2.Spec.Selectors[0].CEL.Expression == dc.Spec.Selectors[0].CEL.Expression {
		t.Errorf("the recreated class kept the old selector: %s", dc2.Spec.Selectors[0].CEL.Expression)
	}
	deleteClassAndWaitGone(t, ctx, name)
}

// TestDeviceClassRefusals: a class whose CEL would be longer than the
// apiserver takes gets no DeviceClass, the condition DeviceClass=False
// (Untranslatable) and a Warning Event; a DeviceClass of the class's name that
// resclass does not own is left alone (NameTaken).
func TestDeviceClassRefusals(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()

	var long []string
	for i := range 64 {
		long = append(long, strings.Repeat("v", 120)+string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	const big = "dra.too.big"
	createClass(t, ctx, big, []v1alpha1.ResourceSelectorRequirement{
		req("product", v1alpha1.ResourceSelectorOpIn, long...), req("architecture", v1alpha1.ResourceSelectorOpNotIn, long...),
	})
	cond := waitCondition(t, ctx, big, metav1.ConditionFalse, dra.ReasonUntranslatable)
	if !strings.Contains(cond.Message, "10240") {
		t.Errorf("the condition does not say why: %q", cond.Message)
	}
	if _, err := cluster.Client.ResourceV1().DeviceClasses().Get(ctx, big, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("an untranslatable class has a DeviceClass: %v", err)
	}
	poll(t, ctx, 30*time.Second, "Warning Event DeviceClassUntranslatable on "+big, func(ctx context.Context) (bool, error) {
		evs, err := cluster.Client.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Regarding.Kind == "ResourceClass" && e.Regarding.Name == big && e.Reason == "DeviceClassUntranslatable" && e.Type == "Warning" {
				return true, nil
			}
		}
		return false, nil
	})

	const taken = "dra.taken"
	foreign := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: taken},
		Spec:       resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}}},
	}
	if _, err := cluster.Client.ResourceV1().DeviceClasses().Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.ResourceV1().DeviceClasses().Delete(context.Background(), taken, metav1.DeleteOptions{})
	})
	createClass(t, ctx, taken, []v1alpha1.ResourceSelectorRequirement{req("kind", v1alpha1.ResourceSelectorOpExists)})
	waitCondition(t, ctx, taken, metav1.ConditionFalse, dra.ReasonNameTaken)
	got, err := cluster.Client.ResourceV1().DeviceClasses().Get(ctx, taken, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.Selectors[0].CEL.Expression != foreign.Spec.Selectors[0].CEL.Expression || len(got.OwnerReferences) > 0 {
		t.Errorf("the controller changed a DeviceClass it does not own: %+v", got)
	}
}

// TestDeviceClassWriters: of resclass's identities only the scheduler may
// write DeviceClasses, and only those of ResourceClasses (RBAC, and the
// admission policy resclass-scheduler-deviceclass-writes); the node agent and
// the webhook may not (impersonated, on the real apiserver).
func TestDeviceClassWriters(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	selectors := []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: "true"}}}
	owned := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "dra.writers", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "resclass.io/v1alpha1", Kind: "ResourceClass", Name: "dra.writers", UID: "0f1e2d3c-0000-4000-8000-000000000001", Controller: ptrTo(true),
		}}},
		Spec: resourceapi.DeviceClassSpec{Selectors: selectors},
	}
	unowned := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "dra.writers"}, Spec: resourceapi.DeviceClassSpec{Selectors: selectors}}
	// Another driver's DeviceClass, which nobody of resclass may delete.
	foreign := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "dra.foreign"}, Spec: resourceapi.DeviceClassSpec{Selectors: selectors}}
	if _, err := cluster.Client.ResourceV1().DeviceClasses().Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.ResourceV1().DeviceClasses().Delete(context.Background(), foreign.Name, metav1.DeleteOptions{})
	})
	dryRun := []string{metav1.DryRunAll}
	for _, tc := range []struct {
		user                  string
		createOwned, anything bool
	}{
		{"system:serviceaccount:resclass-system:resclass-scheduler", true, false},
		{"system:serviceaccount:resclass-system:resclass-webhook", false, false},
		{"system:serviceaccount:resclass-node:resclass-node-agent", false, false},
	} {
		c, err := kubernetes.NewForConfig(impersonating(tc.user, "system:serviceaccounts", "system:authenticated"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.ResourceV1().DeviceClasses().Create(ctx, owned, metav1.CreateOptions{DryRun: dryRun})
		if tc.createOwned != (err == nil) || (err != nil && !apierrors.IsForbidden(err)) {
			t.Errorf("%s creating a ResourceClass's DeviceClass: %v (want allowed=%v, else Forbidden)", tc.user, err, tc.createOwned)
		}
		_, err = c.ResourceV1().DeviceClasses().Create(ctx, unowned, metav1.CreateOptions{DryRun: dryRun})
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s creating a DeviceClass no ResourceClass controls: want Forbidden, got %v", tc.user, err)
		}
		err = c.ResourceV1().DeviceClasses().Delete(ctx, foreign.Name, metav1.DeleteOptions{DryRun: dryRun})
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s deleting another driver's DeviceClass: want Forbidden, got %v", tc.user, err)
		}
	}
}
