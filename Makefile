# resclass — the same commands in README, CI and your own loop.
#
#   make demo       the suite on simulated nodes, explained as it goes
#   make test       every test, unit to e2e
#   make bench      benchmarks as `bench: NAME VALUE UNIT` lines (BENCH=NAME for one)
#   make generate   deepcopy, CRDs and pkg/client from pkg/apis (controller-gen, code-generator), proto/ (protoc)
#   make verify     fails when generated files, go.mod or formatting are stale
#   make lint       gofmt, go vet, golangci-lint
#   make build      the three binaries and the kubectl plugin (kubectl-resclass) into bin/
#   make gpu-bundle the node agent and the real-GPU tests, for a GPU machine without Go

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

# Pinned tool versions; installed into bin/ by `go install` on first use.
CONTROLLER_GEN_VERSION := v0.21.0
GOLANGCI_LINT_VERSION := v2.15.0
KUBERNETES_VERSION := $(shell go list -m -f '{{.Version}}' k8s.io/kubernetes)
# The code generators of the client-go release in go.mod.
CODE_GENERATOR_VERSION := $(shell go list -m -f '{{.Version}}' k8s.io/client-go)

BIN := $(CURDIR)/bin
# Binaries of the embedded cluster (e2e tests, demo): built once, reused.
E2E_BIN := $(CURDIR)/_output/bin
CONTROLLER_GEN := $(BIN)/controller-gen-$(CONTROLLER_GEN_VERSION)
GOLANGCI_LINT := $(BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
CODE_GENERATOR := $(BIN)/code-generator-$(CODE_GENERATOR_VERSION)

# Binaries built from k8s.io/kubernetes report v0.0.0-master unless told their version.
K8S_VERSION_LDFLAGS := -X k8s.io/component-base/version.gitVersion=$(KUBERNETES_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 \
	-X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(KUBERNETES_VERSION)))

TEST_FLAGS ?=
BENCH ?=

.PHONY: all
all: generate lint build test

.PHONY: build
build:
	go build -tags grpcnotrace -ldflags '$(K8S_VERSION_LDFLAGS)' -o $(BIN)/ ./cmd/...

# The node agent and the compiled tests of e2e/realgpu in one tarball,
# _output/resclass-gpu-bundle.tar.gz (docs/node-agent.md, "Testing on a real GPU").
.PHONY: gpu-bundle
gpu-bundle:
	hack/gpu-bundle.sh

.PHONY: test
test: e2e-binaries
	go test $(TEST_FLAGS) ./...

# The real Kubernetes parts (pinned by go.mod's tool block and hack/tools) and our
# binaries the embedded cluster runs, built once into _output/bin and reused.
.PHONY: e2e-binaries
e2e-binaries:
	@hack/build-e2e-binaries.sh "$(K8S_VERSION_LDFLAGS)"

# Container images of the three binaries (Dockerfile, one target each), built
# with BuildKit: `make images REGISTRY=my.registry/resclass TAG=v0.1.0`, or one
# of them with `make image-scheduler`.
REGISTRY ?= ghcr.io/resclass
TAG ?= dev
IMAGES := node-agent scheduler webhook

.PHONY: images $(addprefix image-,$(IMAGES))
images: $(addprefix image-,$(IMAGES))
$(addprefix image-,$(IMAGES)): image-%:
	docker buildx build --target $* -t $(REGISTRY)/resclass-$*:$(TAG) .

.PHONY: bench
bench: e2e-binaries
	hack/bench.sh $(BENCH)

# DEMO_KEEP=1 keeps the cluster up for kubectl until Ctrl-C. The demo needs no
# simulated nodes and renders nothing, so it skips building kwok, kustomize
# and helm.
.PHONY: demo
demo:
	@hack/build-e2e-binaries.sh "$(K8S_VERSION_LDFLAGS)" --demo
	@# Built with the others, then run: `go run` exits 1 when Ctrl-C interrupts
	@# it, whatever the demo does.
	_output/bin/demo

.PHONY: generate
generate: $(CONTROLLER_GEN) $(CODE_GENERATOR)
	$(CONTROLLER_GEN) object paths=./pkg/apis/...
	rm -f deploy/crds/*.yaml
	$(CONTROLLER_GEN) crd paths=./pkg/apis/... output:crd:artifacts:config=deploy/crds
	hack/bound-crd-quantities.sh deploy/crds/*.yaml
	cp deploy/crds/*.yaml deploy/helm/resclass/crds/
	hack/update-codegen.sh $(CODE_GENERATOR)
	hack/update-proto.sh

.PHONY: verify
verify: generate
	hack/update-k8s-replaces.sh $(patsubst v%,%,$(KUBERNETES_VERSION)) 2>/dev/null
	go mod tidy
	go -C hack/tools mod tidy
	@if ! git diff --quiet --exit-code -- go.mod go.sum hack/tools pkg/apis pkg/client deploy/crds proto || [ -n "$$(git status --porcelain -- go.mod go.sum hack/tools pkg/apis pkg/client deploy/crds proto)" ]; then \
		git status --short -- go.mod go.sum hack/tools pkg/apis pkg/client deploy/crds proto; { git diff -- go.mod go.sum hack/tools pkg/apis pkg/client deploy/crds proto | head -50 || true; }; \
		echo "generated files or go.mod are stale: run 'make generate' and 'go mod tidy', then commit" >&2; exit 1; \
	fi
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then \
		echo "not gofmt'd: $$unformatted" >&2; exit 1; fi

.PHONY: lint
lint: $(GOLANGCI_LINT)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then \
		echo "not gofmt'd: $$unformatted" >&2; exit 1; fi
	go vet ./...
	$(GOLANGCI_LINT) run ./...

.PHONY: fuzz
# Minimizing a new input takes up to 60s by default, shown as 0 execs/s: 5s keeps
# the run about FUZZTIME per target (docs/development.md, "Fuzzing").
fuzz: ## run every fuzz target for FUZZTIME each (default 10s)
	@for pkg in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
		for f in $$(grep -h -o '^func Fuzz[A-Za-z0-9_]*' $$pkg/*_test.go | cut -d' ' -f2); do \
			echo "== $$pkg $$f"; go test $$pkg -run='^$$' -fuzz="^$$f$$" -fuzztime=$${FUZZTIME:-10s} -fuzzminimizetime=$${FUZZMINIMIZETIME:-5s}; \
		done; done

$(CONTROLLER_GEN):
	GOBIN=$(BIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv $(BIN)/controller-gen $@

$(CODE_GENERATOR):
	GOBIN=$@ go install $(addprefix k8s.io/code-generator/cmd/,$(addsuffix @$(CODE_GENERATOR_VERSION),client-gen lister-gen informer-gen applyconfiguration-gen))

$(GOLANGCI_LINT):
	GOBIN=$(BIN) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(BIN)/golangci-lint $@

.PHONY: clean
clean:
	rm -rf $(BIN) _output
