#!/usr/bin/env bash
# Generates the Go code of the protobuf APIs under proto/ (the node agent's
# introspection API): *.pb.go and *_grpc.pb.go next to each .proto file. Run by
# `make generate`. The plugins, protoc-gen-go and protoc-gen-go-grpc, are built
# from the versions in go.mod (its tool block), so the output matches the
# google.golang.org/protobuf and google.golang.org/grpc the code compiles against.
# protoc itself comes from the system (Debian: protobuf-compiler).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v protoc >/dev/null; then
	echo "protoc not found on PATH: install it with 'apt-get install protobuf-compiler' (or from https://github.com/protocolbuffers/protobuf/releases)" >&2
	exit 1
fi

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin" google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc

protos=(proto/resclass/agent/v1/agent.proto)
PATH="$bin:$PATH" protoc --proto_path=proto \
	--go_out=proto --go_opt=paths=source_relative \
	--go-grpc_out=proto --go-grpc_opt=paths=source_relative \
	"${protos[@]}"
