#!/usr/bin/env bash
# Builds the Kubernetes programs the tests of kube/ run, from Go modules:
# kube-apiserver, kube-scheduler and kubectl at the k8s.io/kubernetes
# version kube/go.mod pins (its staging modules pinned by replace), and helm
# at HELM_VERSION (go install of its own module). They are installed into
# KUBE_BIN_DIR with a marker holding the versions and the Go toolchain they
# were built with; when the marker matches, nothing is built.
#
# Cold, this is the slowest step of the setup (kube-apiserver alone takes
# about 4 minutes of 2 cores); warm it costs a second. Run as root.
# Environment:
#   KUBE_BIN_DIR   install directory (default /var/cache/agentjail/kube/bin)
#   HELM_VERSION   helm release to build (default v4.3.1)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
KUBE_BIN_DIR=${KUBE_BIN_DIR:-/var/cache/agentjail/kube/bin}
HELM_VERSION=${HELM_VERSION:-v4.3.1}
export PATH="/usr/local/go/bin:$PATH"
export CGO_ENABLED=0

log() { printf 'build-kube: %s\n' "$*" >&2; }

k8s=$(cd "$root/kube" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
want="kubernetes $k8s helm $HELM_VERSION $(go env GOVERSION)"
marker="$KUBE_BIN_DIR/.built"
present() {
	for b in kube-apiserver kube-scheduler kubectl helm; do
		[ -x "$KUBE_BIN_DIR/$b" ] || return 1
	done
}
if [ "$(cat "$marker" 2>/dev/null)" = "$want" ] && present; then
	exit 0
fi

mkdir -p "$KUBE_BIN_DIR"
rm -f "$marker"
start=$SECONDS
# Unstamped builds report v0.0.0-master+$Format:%H$, which kubectl cannot
# parse: stamp the release into both version packages.
v=${k8s#v}
major=${v%%.*}
minor=${v#*.}
minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
	ldflags+=" -X $pkg.gitVersion=$k8s -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
log "building kube-apiserver, kube-scheduler and kubectl $k8s (cold: several minutes)"
(cd "$root/kube" && go build -trimpath -ldflags "$ldflags" -o "$KUBE_BIN_DIR/" \
	k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
log "building helm $HELM_VERSION"
GOBIN="$KUBE_BIN_DIR" GOFLAGS=-mod=mod go install -trimpath -ldflags "-s -w" "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
echo "$want" >"$marker"
log "built in $((SECONDS - start)) s into $KUBE_BIN_DIR"
