# syntax=docker/dockerfile:1
#
# The three resclass images, one target each (`make images` builds them all):
#
#   docker buildx build --target node-agent -t ghcr.io/resclass/resclass-node-agent:dev .
#   docker buildx build --target scheduler  -t ghcr.io/resclass/resclass-scheduler:dev .
#   docker buildx build --target webhook    -t ghcr.io/resclass/resclass-webhook:dev .
#
# BuildKit builds only the stages a target needs, so each target compiles one
# binary. The Go module and build caches are cache mounts: they survive between
# builds without ending up in any layer.
#
# Base images (tags, pin digests in your own release pipeline if you need to):
# - builder: golang:1.26-bookworm, Debian 12 like the runtime images, so the cgo
#   node agent links against the glibc it runs with;
# - node-agent: gcr.io/distroless/base-debian12 (glibc, no shell): go-nvml uses
#   cgo to dlopen the host's libnvidia-ml.so.1, so the agent cannot be static
#   (CGO_ENABLED=0 does not compile: go-nvml's types are cgo-generated);
# - scheduler, webhook: gcr.io/distroless/static-debian12:nonroot: both build
#   with CGO_ENABLED=0 and run as the distroless nonroot user (65532).
#
# -tags grpcnotrace: gRPC otherwise links golang.org/x/net/trace, whose HTML
# templates call methods by name through reflection, and then the linker keeps
# every exported method of every type: the node agent's binary is 63 MB of
# mapped text instead of 40, nearly all of it resident (docs/node-agent.md,
# "Memory"; e2e BenchmarkAgentRSS builds the agent with this file's command).

FROM golang:1.26-bookworm AS builder
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .

FROM builder AS build-node-agent
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=1 go build -trimpath -tags grpcnotrace -o /out/node-agent ./cmd/node-agent

# kube-scheduler reports v0.0.0-master unless told its version: the same
# -X flags as the Makefile's K8S_VERSION_LDFLAGS, computed from go.mod.
FROM builder AS build-scheduler
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    k8s="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)" && \
    minor="$(echo "$k8s" | cut -d. -f2)" && \
    CGO_ENABLED=0 go build -trimpath -tags grpcnotrace \
      -ldflags "-X k8s.io/component-base/version.gitVersion=$k8s -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
      -o /out/scheduler ./cmd/scheduler

FROM builder AS build-webhook
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -tags grpcnotrace -o /out/webhook ./cmd/webhook

# The node agent runs as root (USER 0 over the image's nonroot default): it
# serves its device-plugin sockets in the kubelet's root-owned
# /var/lib/kubelet/device-plugins and its own socket in /var/run/resclass
# (deploy/node-agent/daemonset.yaml says why, and what else it is given). On
# PATH so that `kubectl exec ... -- node-agent status` works.
FROM gcr.io/distroless/base-debian12:nonroot AS node-agent
COPY --from=build-node-agent /out/node-agent /usr/local/bin/node-agent
USER 0:0
ENTRYPOINT ["/usr/local/bin/node-agent"]

FROM gcr.io/distroless/static-debian12:nonroot AS scheduler
COPY --from=build-scheduler /out/scheduler /usr/local/bin/scheduler
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/scheduler"]

FROM gcr.io/distroless/static-debian12:nonroot AS webhook
COPY --from=build-webhook /out/webhook /usr/local/bin/webhook
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/webhook"]
