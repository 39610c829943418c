#!/usr/bin/env bash
# Builds and installs runsc, gVisor's OCI runtime, for the gvisor isolation
# level, at /usr/local/sbin/runsc.
#
# runsc is built from the gVisor Go module (gvisor.dev/gvisor, its `go`
# branch as published on the Go module proxy) at the version go.mod pins
# (agentjail imports the module's runtime-monitoring types, so one pin
# serves both), with `go install` against the module's own go.mod, static
# (CGO_ENABLED=0), its version stamped in. Nothing is downloaded from
# anywhere but the Go module proxy.
#
# Idempotent: nothing happens when the installed runsc reports the pinned
# version. Run as root. Environment:
#   RUNSC_PREFIX   install directory (default /usr/local/sbin)
set -euo pipefail

RUNSC_PREFIX=${RUNSC_PREFIX:-/usr/local/sbin}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH="/usr/local/go/bin:$PATH"

log() { printf 'build-runsc: %s\n' "$*" >&2; }

version=$(cd "$here/.." && go list -m -f '{{.Version}}' gvisor.dev/gvisor)
want="runsc version agentjail-$version"
bin="$RUNSC_PREFIX/runsc"
if [ -x "$bin" ] && [ "$("$bin" --version 2>/dev/null | head -n1)" = "$want" ]; then
	exit 0
fi

log "building runsc from gvisor.dev/gvisor@$version"
start=$(date +%s)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && CGO_ENABLED=0 GOBIN="$tmp" GOFLAGS=-trimpath go install \
	-ldflags "-X gvisor.dev/gvisor/runsc/version.version=agentjail-$version" \
	"gvisor.dev/gvisor/runsc@$version")
got=$("$tmp/runsc" --version | head -n1)
[ "$got" = "$want" ] || {
	log "error: the built runsc reports \"$got\", not \"$want\""
	exit 1
}
mkdir -p "$RUNSC_PREFIX"
install -m 0755 "$tmp/runsc" "$bin.new"
mv -f "$bin.new" "$bin"
log "installed $bin ($got) in $(($(date +%s) - start)) s"
