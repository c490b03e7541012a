package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestDemo runs the whole demo on the embedded cluster with the example classes and
// node profiles that ship with the repository, and checks the answers it prints,
// so that the README's `make demo` and the examples stay true.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out, options{root: "../.."}); err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	text := out.String()
	for _, want := range []string{
		// kubectl get nodedevices: GPUs, NICs, hugepage pools, unhealthy
		"dgx-a100      8     2     2              0",
		"t4-inference  2     1     1              1",
		// healthy/all per node: dgx-a100, nic-gateway, t4-inference, cluster
		"nvidia.high.mem  8/8       0/0          0/0           8/8",
		"hugepages-1gig   2/2       1/1          0/0           3/3",
		"fast.nic         2/2       2/2          0/0           4/4",
		"inference.gpu    8/8       0/0          1/2           9/10",
		"Eq, Gt, GtEq, Lt and LtEq take exactly one value",
		"spec is immutable",
		"memory is 15Gi, not GtEq 30G",
		`spec.resourceSelector[0].matchExpressions[1].values[0]: Invalid value: "40000"`,
		"resclass.io/assignment: {\"node\":\"dgx-a100\"",
		"A corrupt assignment is refused",
		"only the resclass scheduler may set, change or remove the pod annotation",
		"CDI device resclass.io/gpu=GPU-",
		"GPUs are assigned by the resclass scheduler, not chosen by a pod: container train sets NVIDIA_VISIBLE_DEVICES",
		// the webhook: the affinity policy and the critical-pods quota
		"empty namespaceSelector selects every namespace",
		"insufficient quota to match these scopes: [{CrossNamespacePodAffinity Exists []}]",
		"insufficient quota to match these scopes: [{PriorityClass In [cluster-services]}]",
		"exceeded quota: cluster-services",
		// ResourceDistribution
		"ml-settings  ConfigMap  ml-settings  2        2",
		`Synced=False (Conflict): Secret "registry" exists in 1 target namespace(s) and is not this distribution's; it is left untouched: ml-serve`,
		`user "dana" may not create secrets in 2 target namespace(s): ml-serve, web`,
		// kubectl resclass
		"$ kubectl resclass capacity",
		"Insufficient free devices of class nvidia.high.mem",
		"Requests:   nvidia.high.mem=16",
		"FailedScheduling",
		`resourceSelector[0]: kind is "nic", not In nvidia-gpu`,
		"speed is 100Gbps, not GtEq 200Gbps",
		// a shared GPU
		"mode: TimeSlicing",
		"enforcement: memory by SchedulerAccounting (Accounting)",
		"demo/notebook-1: assignment shares GPU-",
		"memory 10Gi, compute 25%",
		"demo/notebook-2: assignment shares GPU-",
		"memory 20Gi, compute 50%",
		"container env RESCLASS_SHARE_MEMORY=21474836480 RESCLASS_SHARE_COMPUTE=50",
		// MIG slices made for pods
		"mode Dynamic, profiles and",
		"/mig/3g.20gb@4 -> CDI device resclass.io/gpu=MIG-",
		"/mig/1g.10gb@0 -> CDI device resclass.io/gpu=MIG-",
		"The GPU's instances, as published: 1g.10gb@0 (created), 3g.20gb@4 (created)\n",
		"The GPU's instances, as published: 1g.10gb@0 (created)\n",
		"allocatable 4, requested 3, available 1",
		// a DRA-mode node, served by the stock resclass-dra profile
		". node dra-node ready",
		"extendedResourceName: class.resclass.io/nvidia.high.mem",
		`- cel: {expression: 'device.driver == "resclass.io"`,
		`a["kind"] == "nvidia-gpu" && ("memory" in c && c["memory"].compareTo(quantity("30G")) >= 0)`,
		"driver resclass.io, pool dra-node, 8 devices",
		"kind: nvidia-gpu, product: Mock NVIDIA A100-SXM4-40GB",
		"capacity: {memory: 40Gi}",
		"Running on dra-node; claim dra-ext-extended-resources-",
		": 1 GPU, GPU-",
		"Running on dra-node; claim dra-claim-gpus-",
		": 2 GPUs, GPU-",
		"      resclass.io/claim=",
		"      resclass.io/gpu=GPU-",
		"      RESCLASS_DEVICES_NVIDIA_HIGH_MEM=GPU-",
		// MIG slices made on demand on the DRA node
		"limit: 9 counters) and its 25 potential slices",
		"/mig/1g.10gb@6 -> CDI device resclass.io/gpu=MIG-",
		"the GPU's instances, in NVML: 1g.10gb@6\n",
		"the GPU's instances, in NVML: none\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("demo output:\n%s", text)
	}
}
