#!/usr/bin/env bash
# Prepares a Debian 12 host to build, run and test agentjail.
#
# Installs the Debian packages the daemon and its tests use, builds CRIU >= 4.1
# when the installed one is missing, too old or broken (scripts/build-criu.sh),
# unpacks the vm level's guest kernel (scripts/build-vm-kernel.sh),
# checks that Go >= 1.26 is on PATH, and builds runsc for the gvisor level
# from the gVisor Go module when the pinned one is not installed
# (scripts/build-runsc.sh; Debian's older runsc package is installed beside it
# as the benchmarks' reference). Idempotent and fast when everything
# is present: packages are checked with dpkg-query and `apt-get update` runs
# only when one is missing. Must run as root.
set -euo pipefail

GO_MIN_MAJOR=1
GO_MIN_MINOR=26
PACKAGES=(runc iptables nftables iproute2 xfsprogs btrfs-progs util-linux strace python3
	git curl ca-certificates tshark procps psmisc tmux asciinema protobuf-compiler patch busybox-static
	skopeo umoci mmdebstrap chromium fonts-dejavu-core clang llvm libbpf-dev runsc
	qemu-system-x86 erofs-utils lz4)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export DEBIAN_FRONTEND=noninteractive
export PATH="/usr/local/sbin:/usr/local/go/bin:$PATH"

log() { printf 'setup: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

[ "$(id -u)" -eq 0 ] || die "must run as root: agentjail creates mounts, loop devices, cgroups and network namespaces (try: sudo make setup)"

missing=()
for p in "${PACKAGES[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done
if ((${#missing[@]} > 0)); then
	log "installing: ${missing[*]}"
	# tshark asks whether non-root users may capture; answer no.
	echo 'wireshark-common wireshark-common/install-setuid boolean false' | debconf-set-selections
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

"$here/build-criu.sh"
# The vm level's guest kernel (Debian's, pinned; see the script).
"$here/build-vm-kernel.sh"

command -v go >/dev/null 2>&1 || die "go is not on PATH (expected at /usr/local/go/bin); install Go >= $GO_MIN_MAJOR.$GO_MIN_MINOR"
gover=$(go env GOVERSION)
v=${gover#go}
major=${v%%.*}
minor=${v#*.}
minor=${minor%%[!0-9]*}
if ((major < GO_MIN_MAJOR || (major == GO_MIN_MAJOR && minor < GO_MIN_MINOR))); then
	die "$gover at $(command -v go) is older than go$GO_MIN_MAJOR.$GO_MIN_MINOR"
fi
"$here/build-runsc.sh"
# The E2B SDK acceptance tests (test/e2b) run the official e2b SDK on Node.js
# >= 20.18.1, installed from the npm registry as pinned in the lockfile.
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
	nodever=$(node -p 'process.versions.node')
	if node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&b>=18)?0:1)'; then
		lock="$here/../test/e2b/package-lock.json"
		stamp="$here/../test/e2b/node_modules/.agentjail-lock"
		sum=$(sha256sum "$lock" | cut -d' ' -f1)
		if [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
			log "installing the e2b SDK for test/e2b (npm ci)"
			(cd "$here/../test/e2b" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
			echo "$sum" >"$stamp"
		fi
	else
		log "warning: node $nodever is older than 20.18.1: the E2B SDK tests will fail"
	fi
else
	log "warning: node and npm are not installed: the E2B SDK tests will fail"
fi
# The agent tests install Claude Code, Codex CLI, Gemini CLI and opencode
# with npm (through `agentjail agent install`) once per machine into
# /var/cache/agentjail/tools (about 1.3 GB, 40 s on an empty npm cache);
# later runs find them there. The daemon itself needs npm only to install.
if ! command -v npm >/dev/null 2>&1; then
	log "installing npm (agentjail agent install runs it)"
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends npm >/dev/null
fi
mkdir -p /var/cache/agentjail/tools
log "ok: packages present, criu $(criu --version | sed -n 's/^Version: *//p'), $gover, $(/usr/local/sbin/runsc --version | head -n1)"
