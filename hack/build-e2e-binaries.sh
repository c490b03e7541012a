#!/usr/bin/env bash
# Builds the binaries of the embedded cluster (e2e tests, `make demo`) and helm
# (the Helm chart's tests) into _output/bin. Versions come from go.mod's tool
# block and hack/tools/go.mod; go build leaves an up-to-date binary alone, so a
# warm run takes seconds.
#
#   hack/build-e2e-binaries.sh LDFLAGS         every binary
#   hack/build-e2e-binaries.sh LDFLAGS --demo  what `make demo` runs: not kwok,
#                                              kustomize or helm (it reads the pod
#                                              policies' kustomize component itself)
#
# The main module's binaries are built by one `go build`, so that shared packages
# compile once and one binary links while the next compiles; a line every 20s
# says which are done, so a cold build (minutes) is not silent.
set -euo pipefail
cd "$(dirname "$0")/.."
ldflags=${1:-}
with_tools=true
[ "${2:-}" = --demo ] && with_tools=false
out=_output/bin
mkdir -p "$out"
start=$SECONDS

main_module=(
  "kube-apiserver|k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-controller-manager|k8s.io/kubernetes/cmd/kube-controller-manager"
  "kubelet|k8s.io/kubernetes/cmd/kubelet"
  "scheduler|./cmd/scheduler"
  "webhook|./cmd/webhook"
  "kubectl-resclass|./cmd/kubectl-resclass"
  "e2e-node|./e2e/cmd/e2e-node"
  "demo|./e2e/demo"
)
names=() pkgs=()
for step in "${main_module[@]}"; do
  names+=("${step%%|*}")
  pkgs+=("${step#*|}")
done

marker=$(mktemp)
trap 'rm -f "$marker"' EXIT
echo ">> building ${names[*]}"
# -s -w: no symbol table or DWARF, which halves each link (kube-apiserver
# 11.4 s to 5.3 s on a 2-core machine); panics and profiles still name
# functions (the runtime's own tables), only a debugger is left without.
go build -ldflags "-s -w $ldflags" -o "$out/" "${pkgs[@]}" &
build=$!
while kill -0 "$build" 2>/dev/null; do
  for _ in $(seq 20); do
    kill -0 "$build" 2>/dev/null || break 2
    sleep 1
  done
  done_names=()
  for n in "${names[@]}"; do [ "$out/$n" -nt "$marker" ] && done_names+=("$n"); done
  echo ">>   $((SECONDS - start))s: ${#done_names[@]}/${#names[@]} linked ${done_names[*]:-}"
done
wait "$build"

echo ">> building etcd ($((SECONDS - start))s)"
go build -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3

if $with_tools; then
  echo ">> building kwok ($((SECONDS - start))s)"
  go build -C hack/tools -o "$PWD/$out/kwok" sigs.k8s.io/kwok/cmd/kwok
  # The stages kwok plays for simulated nodes and their pods. pod-ready leaves
  # alone the pods labelled resclass.io/simulated-pending (they stay Pending on
  # their node, as in scheduler_perf: docs/e2e.md, "Simulated nodes").
  stages=$(go list -C hack/tools -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo ---
    if [ "$f" = pod/fast/pod-ready.yaml ]; then
      awk '{ print } /^    matchExpressions:$/ && !done { done = 1
        print "    - key: \x27.metadata.labels[\"resclass.io/simulated-pending\"]\x27"
        print "      operator: \x27DoesNotExist\x27" }' "$stages/$f"
    else
      cat "$stages/$f"
    fi
  done >"$out/kwok-stages.yaml"
  grep -q simulated-pending "$out/kwok-stages.yaml" || { echo "kwok's pod-ready stage changed: no selector to extend" >&2; exit 1; }

  # kustomize renders deploy/ for the tests (`kubectl kustomize` without kubectl).
  echo ">> building kustomize ($((SECONDS - start))s)"
  go build -C hack/tools -o "$PWD/$out/kustomize" sigs.k8s.io/kustomize/kustomize/v5
  # helm renders and lints deploy/helm/resclass (deploy/install_test.go), and
  # renders the webhook's pod policies for the e2e tests (e2e/framework,
  # WebhookOptions.Policies). It is told its version and the Kubernetes
  # release of its client libraries, as helm's own release build does: `helm
  # template` checks the chart's kubeVersion against that release.
  echo ">> building helm ($((SECONDS - start))s)"
  helm_version=$(go list -C hack/tools -m -f '{{.Version}}' helm.sh/helm/v3)
  k8s_minor=$(go list -C hack/tools -m -f '{{.Version}}' k8s.io/client-go | cut -d. -f2)
  go build -C hack/tools -o "$PWD/$out/helm" -ldflags "-X helm.sh/helm/v3/internal/version.version=$helm_version \
    -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor \
    -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$k8s_minor" \
    helm.sh/helm/v3/cmd/helm
fi
echo ">> embedded cluster binaries ready in $out ($((SECONDS - start))s)"
