#!/usr/bin/env bash
# Generates the typed clientset, apply configurations, listers and informers of
# resclass.io/v1alpha1 into pkg/client. Run by `make generate`; the generators
# are the k8s.io/code-generator release matching our k8s.io staging version, so
# the output compiles against the client-go in go.mod.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=$1 # directory holding client-gen, lister-gen, informer-gen, applyconfiguration-gen
module=github.com/resclass/resclass
apis=$module/pkg/apis/resclass/v1alpha1
out=pkg/client
header=hack/boilerplate.go.txt
# NodeDevices is its own plural, as in the CRD (nodedevices).
plural=(--plural-exceptions "Endpoints:Endpoints,NodeDevices:NodeDevices")

rm -rf "$out"
"$bin/applyconfiguration-gen" --go-header-file "$header" \
	--output-dir "$out/applyconfiguration" --output-pkg "$module/$out/applyconfiguration" \
	"$apis"
"$bin/client-gen" --go-header-file "$header" "${plural[@]}" \
	--output-dir "$out/clientset" --output-pkg "$module/$out/clientset" \
	--clientset-name versioned --input-base "" --input "$apis" \
	--apply-configuration-package "$module/$out/applyconfiguration"
"$bin/lister-gen" --go-header-file "$header" "${plural[@]}" \
	--output-dir "$out/listers" --output-pkg "$module/$out/listers" \
	"$apis"
"$bin/informer-gen" --go-header-file "$header" "${plural[@]}" \
	--output-dir "$out/informers" --output-pkg "$module/$out/informers" \
	--versioned-clientset-package "$module/$out/clientset/versioned" \
	--listers-package "$module/$out/listers" \
	"$apis"
