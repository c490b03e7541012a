package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
)

// TestAPIServerRefusesOutOfRangeValues: the CRDs are the first door. The
// values that once cost 10^|exponent| to compare (or to decode) are refused by
// the real apiserver, with a message a person can act on, before any
// component reads them; the real values of a fleet pass.
func TestAPIServerRefusesOutOfRangeValues(t *testing.T) {
	diagnoseOnFailure(t, cluster)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("ResourceClass values", func(t *testing.T) {
		for _, tc := range []struct{ value, want string }{
			{"1e999999999", "must keep the exponent within e-18 and e18"},
			{"1e-999999999", "must keep the exponent within e-18 and e18"},
			{"5E019", "must keep the exponent within e-18 and e18"},
			{"1e18", ""},
			{"80Gi", ""},
		} {
			class := &v1alpha1.ResourceClass{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-bounds-"},
				Spec: v1alpha1.ResourceClassSpec{ResourceSelector: []v1alpha1.ResourcePropertySelector{{MatchExpressions: []v1alpha1.ResourceSelectorRequirement{
					{Key: v1alpha1.AttributeMemory, Operator: v1alpha1.ResourceSelectorOpGt, Values: []string{tc.value}},
				}}}},
			}
			created, err := rc.ResclassV1alpha1().ResourceClasses().Create(ctx, class, metav1.CreateOptions{})
			t.Logf("memory Gt %s: %v", tc.value, err)
			if err == nil {
				_ = rc.ResclassV1alpha1().ResourceClasses().Delete(ctx, created.Name, metav1.DeleteOptions{})
			}
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("memory Gt %s refused: %v", tc.value, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) ||
				!strings.Contains(err.Error(), "spec.resourceSelector[0].matchExpressions[0]")):
				t.Errorf("memory Gt %s: %v, want a refusal saying %q", tc.value, err, tc.want)
			}
		}
	})

	t.Run("NodeDevices status", func(t *testing.T) {
		nd, err := rc.ResclassV1alpha1().NodeDevices().Create(ctx, &v1alpha1.NodeDevices{ObjectMeta: metav1.ObjectMeta{Name: "e2e-bounds-node"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = rc.ResclassV1alpha1().NodeDevices().Delete(context.Background(), nd.Name, metav1.DeleteOptions{})
		})
		// Written as raw JSON: apimachinery's own Quantity cannot even
		// hold some of these values without running away.
		status := func(attr string) []byte {
			return []byte(`{"status":{"devices":[{"id":"GPU-0","kind":"nvidia-gpu","healthy":true,"attributes":{` + attr + `}}]}}`)
		}
		for _, tc := range []struct{ attr, want string }{
			{`"memory":{"quantity":"1e999999999"}`, `status.devices[0].attributes.memory.quantity: Invalid value: "1e999999999"`},
			{`"memory":{"quantity":"1e-999999999"}`, `attributes.memory.quantity in body should match`},
			{`"memory":{"quantity":"0.` + strings.Repeat("0", 70) + `1"}`, "may not be more than 64 bytes"},
			{`"speed":{"bandwidth":"1e999Gbps"}`, "attributes.speed.bandwidth in body should match"},
			{`"driverVersion":{"version":"1.2.3.4.5.6.7.8.9"}`, "attributes.driverVersion.version in body should match"},
			{`"driverVersion":{"version":"1.1234567890"}`, "attributes.driverVersion.version in body should match"},
			{`"memory":{"quantity":"81559Mi"},"speed":{"bandwidth":"1.6Tbps"},"driverVersion":{"version":"580.159.04"},"size":{"quantity":"1Ei"}`, ""},
		} {
			_, err := rc.ResclassV1alpha1().NodeDevices().Patch(ctx, nd.Name, types.MergePatchType, status(tc.attr), metav1.PatchOptions{}, "status")
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("%s refused: %v", tc.attr, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("%.60s: %v, want a refusal saying %q", tc.attr, err, tc.want)
			}
		}
	})
}
