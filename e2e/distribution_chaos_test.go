package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/resclass/resclass/e2e/framework"
	"github.com/resclass/resclass/pkg/apis/resclass/v1alpha1"
	"github.com/resclass/resclass/pkg/client/clientset/versioned"
)

// chaosSeedEnv replays a run: set it to the seed a failed run logged.
const chaosSeedEnv = "RESCLASS_CHAOS_SEED"

// TestResourceDistributionChaos: one Secret distributed by label selector
// while namespaces come, go and change labels and foreign same-named Secrets
// appear, on the real apiserver, garbage collector and namespace controller.
// Once the chaos stops, the end state must follow the rules of
// docs/distribution.md, computed from what the apiserver holds then: a copy
// with the latest data in every labelled, live namespace without a foreign
// object; every labelled namespace with one listed as conflicting; no copy
// anywhere else; the counts in the status to match; and no foreign object
// modified, ever.
//
// The operations are random but seeded (math/rand/v2, the seed is logged;
// RESCLASS_CHAOS_SEED replays it — the order the apiserver sees them in still
// varies with timing).
func TestResourceDistributionChaos(t *testing.T) {
	const (
		initial      = 200              // namespaces before the chaos
		seeded       = 20               // of them holding a foreign Secret
		chaosFor     = 15 * time.Second // how long the chaos lasts
		chaosWorkers = 4
		// Each worker acts this often: about 50 operations a second in all,
		// which keeps the apiserver, the namespace controller and the
		// controller busy without starving them on a 2-core machine.
		chaosEvery = 80 * time.Millisecond
		secretName = "chaos-secret"
		dataKey    = "token"
	)
	diagnoseOnFailure(t, cluster)
	ctx := context.Background()
	began := time.Now()

	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(chaosSeedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", chaosSeedEnv, s, err)
		}
	}
	t.Logf("seed %d (replay with %s=%d)", seed, chaosSeedEnv, seed)

	startWebhook(t, framework.WebhookOptions{Selector: webhookLabel})
	ctl := startDistribution(t, framework.DistributionOptions{})
	rc, err := cluster.Resclass()
	if err != nil {
		t.Fatal(err)
	}
	d := &distEnv{t: t, ctx: ctx, rc: rc}
	client := fastClient(t)
	w := &chaosWorld{
		t: t, client: client, secretName: secretName,
		labelKey: "e2e-dist-chaos", labelValue: fmt.Sprintf("c%d", time.Now().UnixNano()),
		labelled: map[string]bool{}, deleted: map[string]bool{}, ops: map[string]int{},
	}
	// Every namespace the test made goes, whatever state the chaos left it in.
	t.Cleanup(w.deleteAll)

	// The clean set, and beside it the namespaces that will bring conflicts:
	// these join the targets only once the distribution exists, so that the
	// conflicts arrive while its first copies are being written.
	names := make([]string, initial)
	forEachParallel(initial, 16, func(i int) {
		ns, err := w.createNamespace(ctx, i >= seeded)
		if err != nil {
			t.Errorf("creating a namespace: %v", err)
		}
		names[i] = ns
	})
	if t.Failed() {
		t.FailNow()
	}
	conflicting := names[:seeded]
	for _, ns := range conflicting {
		if err := w.createForeign(ctx, ns); err != nil {
			t.Fatalf("seeding a foreign Secret in %s: %v", ns, err)
		}
	}

	version := 1
	w.data = fmt.Sprintf("chaos-v%d", version)
	rd := d.create("chaos", secret(secretName, map[string]string{dataKey: w.data}), v1alpha1.ResourceDistributionTargets{
		NamespaceLabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{w.labelKey: w.labelValue}},
	})
	created := time.Now()

	// The chaos, while the first copies are still being written: the seeded
	// namespaces join first, then the workers act at random.
	for _, ns := range conflicting {
		if err := w.relabel(ctx, ns, true); err != nil {
			t.Fatalf("labelling %s: %v", ns, err)
		}
	}
	chaosCtx, stop := context.WithTimeout(ctx, chaosFor)
	defer stop()
	var wg sync.WaitGroup
	for i := range chaosWorkers {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		wg.Go(func() { w.chaos(chaosCtx, rng, chaosEvery) })
	}
	// The data changes twice, at a third and two thirds of the chaos.
	wg.Go(func() {
		for _, at := range []time.Duration{chaosFor / 3, 2 * chaosFor / 3} {
			select {
			case <-chaosCtx.Done():
				return
			case <-time.After(time.Until(created.Add(at))):
			}
			next := fmt.Sprintf("chaos-v%d", version+1)
			err := d.tryUpdate(rd.Name, func(rd *v1alpha1.ResourceDistribution) {
				rd.Spec.Resource = runtime.RawExtension{Raw: secret(secretName, map[string]string{dataKey: next})}
			})
			if err != nil {
				t.Errorf("updating the distribution's data: %v", err)
				return
			}
			version++
			w.mu.Lock()
			w.data = next
			w.mu.Unlock()
			w.count("update-data")
		}
	})
	wg.Wait()
	chaosEnded := time.Now()
	t.Logf("chaos: %d operations (refused ones included) in %v: %s", w.total(), chaosEnded.Sub(created).Round(time.Millisecond), w.summary())

	// The end state, recomputed from the apiserver on every try: namespaces
	// the chaos deleted keep terminating for a while.
	var problems []string
	var final chaosEnd
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		final, problems = w.check(ctx, rc, rd.Name, dataKey)
		return len(problems) == 0, nil
	})
	if err != nil {
		if len(problems) > 20 {
			problems = append(problems[:20], fmt.Sprintf("... and %d more", len(problems)-20))
		}
		t.Fatalf("the end state does not follow the rules 60s after the chaos:\n%s", strings.Join(problems, "\n"))
	}
	t.Logf("converged %v after the chaos stopped: %d namespaces in the cluster (%d with the label, terminating ones included), %d targets, %d copies, %d conflicts",
		time.Since(chaosEnded).Round(time.Millisecond), final.existing, final.labelled, final.targets, final.copies, final.conflicts)

	// No foreign object was ever modified: same uid, same resourceVersion, no
	// owner, unless the chaos deleted its namespace (and it with it).
	var modified, gone int
	for _, f := range w.foreign {
		now, err := client.CoreV1().Secrets(f.namespace).Get(ctx, secretName, metav1.GetOptions{})
		w.mu.Lock()
		deleted := w.deleted[f.namespace]
		w.mu.Unlock()
		switch {
		case deleted && (apierrors.IsNotFound(err) || err == nil && now.UID != f.uid):
			gone++
		case err != nil:
			modified++
			t.Errorf("the foreign Secret in %s: %v", f.namespace, err)
		case now.UID != f.uid || now.ResourceVersion != f.resourceVersion || len(now.OwnerReferences) != 0:
			modified++
			t.Errorf("the foreign Secret in %s was modified: uid %s -> %s, resourceVersion %s -> %s, owners %v",
				f.namespace, f.uid, now.UID, f.resourceVersion, now.ResourceVersion, now.OwnerReferences)
		}
	}
	// Write failures and status conflicts are retried by the controller;
	// how many there were says how hard the chaos pushed it.
	t.Logf("%d foreign Secrets created, %d modified, %d gone with their namespace; %d reconcile errors retried; %.1fs in all",
		len(w.foreign), modified, gone, strings.Count(ctl.Log(), `"Reconciler error"`), time.Since(began).Seconds())
}

// chaosWorld is what the chaos did, for the checks after it.
type chaosWorld struct {
	t                    *testing.T
	client               kubernetes.Interface
	secretName           string
	labelKey, labelValue string

	mu sync.Mutex
	// live are the namespaces the test created and has not deleted; created
	// every one; labelled says whether the test last gave one the label.
	live, created []string
	labelled      map[string]bool
	deleted       map[string]bool
	foreign       []foreignObject
	// data is the latest value the distribution's resource holds.
	data string
	ops  map[string]int
}

// foreignObject is a same-named Secret the test created, not the controller.
type foreignObject struct {
	namespace, resourceVersion string
	uid                        types.UID
}

func (w *chaosWorld) count(op string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ops[op]++
}

func (w *chaosWorld) total() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, v := range w.ops {
		n += v
	}
	return n
}

func (w *chaosWorld) summary() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(w.ops)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, w.ops[k]))
	}
	return strings.Join(parts, " ")
}

func (w *chaosWorld) createNamespace(ctx context.Context, labelled bool) (string, error) {
	var labels map[string]string
	if labelled {
		labels = map[string]string{w.labelKey: w.labelValue}
	}
	ns, err := w.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-chaos-", Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	w.mu.Lock()
	w.live = append(w.live, ns.Name)
	w.created = append(w.created, ns.Name)
	w.labelled[ns.Name] = labelled
	w.mu.Unlock()
	return ns.Name, nil
}

// relabel adds the chaos label to ns, or removes it (a merge patch with null).
func (w *chaosWorld) relabel(ctx context.Context, ns string, labelled bool) error {
	var value any
	if labelled {
		value = w.labelValue
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{w.labelKey: value}}})
	if _, err := w.client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return err
	}
	w.mu.Lock()
	w.labelled[ns] = labelled
	w.mu.Unlock()
	return nil
}

// createForeign creates a same-named Secret the distribution does not own in
// ns, and records it.
func (w *chaosWorld) createForeign(ctx context.Context, ns string) error {
	s, err := w.client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: w.secretName},
		StringData: map[string]string{"owner": "someone else"},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.foreign = append(w.foreign, foreignObject{namespace: ns, uid: s.UID, resourceVersion: s.ResourceVersion})
	w.mu.Unlock()
	return nil
}

// pick returns a random live namespace and whether the test last labelled
// it; "" when the chaos has deleted them all.
func (w *chaosWorld) pick(rng *rand.Rand) (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.live) == 0 {
		return "", false
	}
	ns := w.live[rng.IntN(len(w.live))]
	return ns, w.labelled[ns]
}

// chaos acts every interval until ctx ends: creates namespaces (half of them
// labelled), flips the label of one, deletes one, or puts a foreign Secret in
// one (labelled or not). An operation the apiserver refuses because the
// chaos got there first (the copy or a foreign Secret already there, the
// namespace terminating) is counted as refused; anything else fails the test.
func (w *chaosWorld) chaos(ctx context.Context, rng *rand.Rand, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var (
			op  string
			err error
		)
		ns, labelled := w.pick(rng)
		p := rng.Float64()
		if ns == "" {
			p = 0 // nothing left to act on: make one
		}
		switch {
		case p < 0.15:
			labelled := rng.IntN(2) == 0
			op = "create-namespace-unlabelled"
			if labelled {
				op = "create-namespace-labelled"
			}
			_, err = w.createNamespace(ctx, labelled)
		case p < 0.45:
			op = "label-add"
			if labelled {
				op = "label-remove"
			}
			err = w.relabel(ctx, ns, !labelled)
		case p < 0.55:
			op = "delete-namespace"
			w.mu.Lock()
			if i := slices.Index(w.live, ns); i >= 0 {
				w.live = slices.Delete(w.live, i, i+1)
			}
			w.deleted[ns] = true
			w.mu.Unlock()
			err = w.client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
		default:
			op = "foreign-in-unlabelled"
			if labelled {
				op = "foreign-in-labelled"
			}
			err = w.createForeign(ctx, ns)
		}
		switch {
		case err == nil:
			w.count(op)
		case ctx.Err() != nil:
			// The chaos ended during the call.
			return
		case apierrors.IsAlreadyExists(err) || apierrors.IsForbidden(err) || apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			w.count(op + "-refused")
		default:
			w.t.Errorf("%s: %v", op, err)
		}
	}
}

// chaosEnd counts what the end state holds.
type chaosEnd struct {
	existing, labelled, targets, copies, conflicts int
}

// check compares the apiserver's state with the rules and returns what
// differs (nothing when the distribution has converged).
func (w *chaosWorld) check(ctx context.Context, rc versioned.Interface, name, dataKey string) (chaosEnd, []string) {
	var end chaosEnd
	rd, err := rc.ResclassV1alpha1().ResourceDistributions().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return end, []string{err.Error()}
	}
	nsList, err := w.client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return end, []string{err.Error()}
	}
	secrets, err := w.client.CoreV1().Secrets("").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + w.secretName})
	if err != nil {
		return end, []string{err.Error()}
	}
	w.mu.Lock()
	data := w.data
	known := map[types.UID]bool{}
	for _, f := range w.foreign {
		known[f.uid] = true
	}
	w.mu.Unlock()

	byNS := map[string]*corev1.Secret{}
	for i := range secrets.Items {
		byNS[secrets.Items[i].Namespace] = &secrets.Items[i]
	}
	var problems []string
	var wantSynced, wantConflicts []string
	targets := map[string]bool{}
	for _, ns := range nsList.Items {
		if ns.Labels[w.labelKey] != w.labelValue {
			continue
		}
		end.labelled++
		if ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating {
			continue
		}
		targets[ns.Name] = true
		s := byNS[ns.Name]
		switch {
		case s == nil:
			wantSynced = append(wantSynced, ns.Name)
			problems = append(problems, fmt.Sprintf("%s: labelled, no copy", ns.Name))
		case !metav1.IsControlledBy(s, rd):
			wantConflicts = append(wantConflicts, ns.Name)
			if !known[s.UID] {
				problems = append(problems, fmt.Sprintf("%s: a Secret %s neither the distribution's nor the test's: %v", ns.Name, s.UID, s.OwnerReferences))
			}
		default:
			wantSynced = append(wantSynced, ns.Name)
			if got := string(s.Data[dataKey]); got != data {
				problems = append(problems, fmt.Sprintf("%s: the copy holds %q, want %q", ns.Name, got, data))
			}
		}
	}
	end.existing = len(nsList.Items)
	end.targets = len(targets)
	end.conflicts = len(wantConflicts)
	for ns, s := range byNS {
		if !metav1.IsControlledBy(s, rd) {
			continue
		}
		end.copies++
		if !targets[ns] {
			problems = append(problems, fmt.Sprintf("%s: a copy in a namespace that is not a target", ns))
		}
	}

	st := rd.Status
	slices.Sort(wantSynced)
	slices.Sort(wantConflicts)
	if st.ObservedGeneration != rd.Generation {
		problems = append(problems, fmt.Sprintf("status.observedGeneration %d, generation %d", st.ObservedGeneration, rd.Generation))
	}
	if int(st.Desired) != len(targets) {
		problems = append(problems, fmt.Sprintf("status.desired %d, want %d", st.Desired, len(targets)))
	}
	if int(st.Succeeded) != len(wantSynced) {
		problems = append(problems, fmt.Sprintf("status.succeeded %d, want %d", st.Succeeded, len(wantSynced)))
	}
	if got := slices.Sorted(maps.Keys(st.DistributedResources)); !slices.Equal(got, wantSynced) {
		problems = append(problems, fmt.Sprintf("status.distributedResources has %d namespaces, want %d: %s", len(got), len(wantSynced), setDiff(got, wantSynced)))
	}
	if int(st.Conflicting) != len(wantConflicts) {
		problems = append(problems, fmt.Sprintf("status.conflicting %d, want %d", st.Conflicting, len(wantConflicts)))
	}
	listed := wantConflicts[:min(len(wantConflicts), v1alpha1.MaxConflictingNamespaces)]
	if got := sortedNamespaceNames(st.ConflictingNamespaces); !slices.Equal(got, listed) {
		problems = append(problems, fmt.Sprintf("status.conflictingNamespaces has %d, want %d: %s", len(got), len(listed), setDiff(got, listed)))
	}
	c := meta.FindStatusCondition(st.Conditions, "Synced")
	switch {
	case c == nil:
		problems = append(problems, "no Synced condition")
	case len(wantConflicts) > 0 && (c.Status != metav1.ConditionFalse || c.Reason != "Conflict"):
		problems = append(problems, fmt.Sprintf("Synced is %s/%s, want False/Conflict", c.Status, c.Reason))
	case len(wantConflicts) == 0 && c.Status != metav1.ConditionTrue:
		problems = append(problems, fmt.Sprintf("Synced is %s/%s, want True", c.Status, c.Reason))
	}
	return end, problems
}

// setDiff names what got has beyond want and lacks of it (both sorted).
func setDiff(got, want []string) string {
	var extra, missing []string
	for _, s := range got {
		if _, ok := slices.BinarySearch(want, s); !ok {
			extra = append(extra, s)
		}
	}
	for _, s := range want {
		if _, ok := slices.BinarySearch(got, s); !ok {
			missing = append(missing, s)
		}
	}
	return fmt.Sprintf("extra %v, missing %v", extra, missing)
}

func sortedNamespaceNames(nss []v1alpha1.ResourceDistributionNamespace) []string {
	names := make([]string, len(nss))
	for i, ns := range nss {
		names[i] = ns.Name
	}
	slices.Sort(names)
	return names
}

// deleteAll deletes every namespace the test created, without waiting: the
// namespace controller finishes on its own.
func (w *chaosWorld) deleteAll() {
	w.mu.Lock()
	names := slices.Clone(w.created)
	w.mu.Unlock()
	forEachParallel(len(names), 16, func(i int) {
		_ = w.client.CoreV1().Namespaces().Delete(context.Background(), names[i], metav1.DeleteOptions{})
	})
}

// forEachParallel calls f(0) ... f(n-1) on the given number of goroutines.
func forEachParallel(n, workers int, f func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(workers, max(n, 1)) {
		wg.Go(func() {
			for i := range next {
				f(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
