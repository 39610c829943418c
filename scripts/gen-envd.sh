#!/usr/bin/env bash
# Generates the Go code of the E2B sandbox plane's protobuf services
# (internal/e2b/envd/*/*.proto) with Debian's protoc and the protoc-gen-go and
# protoc-gen-connect-go versions pinned in go.mod (its tool directives).
#
#   scripts/gen-envd.sh [OUT]   OUT defaults to internal/e2b/envd
#
# internal/e2b/envd's tests run it into a temporary directory and fail when the
# committed code differs (a .proto changed without regenerating).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-internal/e2b/envd}
src=internal/e2b/envd
pkg=github.com/agentjail/agentjail/$src
command -v protoc >/dev/null || { echo "gen-envd: protoc is not installed (apt-get install protobuf-compiler)" >&2; exit 1; }
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$bin/protoc-gen-connect-go" connectrpc.com/connect/cmd/protoc-gen-connect-go
mkdir -p "$out"
maps=Mprocess/process.proto=$pkg/process,Mfilesystem/filesystem.proto=$pkg/filesystem
protoc -I "$src" -I /usr/include \
	--plugin=protoc-gen-go="$bin/protoc-gen-go" \
	--plugin=protoc-gen-connect-go="$bin/protoc-gen-connect-go" \
	--go_out="$out" --go_opt=paths=source_relative,"$maps" \
	--connect-go_out="$out" --connect-go_opt=paths=source_relative,"$maps" \
	process/process.proto filesystem/filesystem.proto
