#!/usr/bin/env bash
# Builds the binaries of the embedded cluster (e2e tests, `make demo`) into
# _output/bin, one line of progress per binary. Versions come from go.mod's tool
# block and hack/tools/go.mod; go build leaves an up-to-date binary alone, so a
# warm run takes seconds.
#
#   hack/build-e2e-binaries.sh LDFLAGS
set -euo pipefail
cd "$(dirname "$0")/.."
ldflags=${1:-}
out=_output/bin
mkdir -p "$out"

steps=(
  "kube-apiserver|k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-controller-manager|k8s.io/kubernetes/cmd/kube-controller-manager"
  "kubelet|k8s.io/kubernetes/cmd/kubelet"
  "etcd|go.etcd.io/etcd/server/v3"
  "scheduler|./cmd/scheduler"
  "e2e-node|./e2e/cmd/e2e-node"
  "kwok|sigs.k8s.io/kwok/cmd/kwok"
)
n=${#steps[@]}
i=0
start=$SECONDS
for step in "${steps[@]}"; do
  i=$((i + 1))
  name=${step%%|*} pkg=${step#*|}
  t=$SECONDS
  printf '>> [%d/%d] %-24s' "$i" "$n" "$name"
  if [ "$name" = kwok ]; then
    go build -C hack/tools -o "$PWD/$out/$name" "$pkg"
  else
    go build -ldflags "$ldflags" -o "$out/$name" "$pkg"
  fi
  echo "$((SECONDS - t))s"
done

# The stages kwok plays for simulated nodes and their pods.
stages=$(go list -C hack/tools -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage
for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
  pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
  echo ---
  cat "$stages/$f"
done >"$out/kwok-stages.yaml"
echo ">> embedded cluster binaries ready in $out ($((SECONDS - start))s)"
