#!/usr/bin/env bash
# Builds and installs CRIU >= 4.1 at /usr/local/sbin/criu.
#
# Debian 12 ships CRIU 3.17, which fails on every command on kernels >= 6.13
# (the vDSO "vvar_vclock" split, fixed in CRIU 4.1). The trixie binary package
# needs a newer libc, so this script builds CRIU 4.1.1 from trixie's source
# package against bookworm's libraries.
#
# The build carries agentjail's patches (scripts/criu-*.patch):
#   - rlimits: a root without CAP_SYS_RESOURCE, as on these machines, cannot
#     read the rlimits of another uid's process with prlimit64(), so CRIU
#     falls back to /proc/PID/limits;
#   - freeze-poll: CRIU polls a freezing cgroup every 100 ms, which makes
#     every dump of a small jail wait 100 ms, so it first polls at short,
#     doubling intervals;
#   - freeze-vfork: a process frozen while it waits for a vfork() child's
#     exec (dash, posix_spawn and Go start programs so) cannot be seized,
#     and the dump failed after its 10 s timeout; CRIU now thaws for a
#     millisecond and freezes again until no task of the cgroup waits so;
#   - spawn-vfork: CRIU starts tar, iptables and action scripts from a
#     vfork-style child instead of a fork() that copies its page tables;
#   - tmpfs: an empty tmpfs mount (the masked /proc and /sys directories,
#     /dev/shm) is dumped and restored without starting tar, and the others
#     are archived without gzip (restore tells the two apart);
#   - populate: a restore maps the pages it fills with one
#     madvise(MADV_POPULATE_WRITE) per range instead of a page fault per
#     page, which costs microseconds in these VMs (256 MB: 1.27 -> 0.69 s);
#   - untar: a tmpfs archive of plain members (a container's /dev and
#     /sys/fs/cgroup) is extracted by CRIU itself instead of by starting tar
#     (about 5 ms per mount and restore);
#   - script-actions: CRIU_SCRIPT_ACTIONS limits the actions an action script
#     is started at (agentjail's acts at one action only);
#   - wait-async-scripts: CRIU_SCRIPT_ASYNC names actions whose scripts may
#     leave work running; such a script gets a pipe as descriptor 3 for the
#     work's status, and CRIU waits for it before any later action's scripts
#     and at the end of every dump (a failed one fails the dump), so
#     agentjail's copy of the jail's disk (a filesystem freeze that mostly
#     waits on the kernel) runs beside the dump of the jail's memory
#     instead of after it, while the jail is frozen;
#   - passcred: Linux >= 6.16 answers EOPNOTSUPP when SO_PASSCRED or
#     SO_PASSSEC is read of a socket other than unix or netlink, and CRIU
#     read them of every socket, so no process holding a TCP or UDP socket
#     (a dev server's listener) could be dumped; CRIU now reads them of unix
#     and netlink sockets only;
#   - helper-fs: a process whose session or group leader exited (the
#     background job of a finished shell: `sh -c 'cmd &'`, `nohup cmd &`, a
#     daemon that forked twice) is restored with a short-lived helper in the
#     leader's place, which CRIU made share the file table and filesystem
#     context of its parent; a parent that then had to enter a mount
#     namespace to restore a unix socket bound to a path (the jail's init
#     and its control socket) failed with EINVAL, and so did the restore.
#     Helpers now get copies of both;
#   - memory-merge: given CRIU_MEMORY_MERGE=1, a restore makes the restored
#     tasks' memory mergeable by the kernel's same-page merging (it sets
#     PR_SET_MEMORY_MERGE before forking them), so that ksmd shares what
#     branches of one snapshot hold alike, copy-on-write;
#   - kdat-cache: CRIU keeps its kernel-feature cache when /run is not a
#     tmpfs, as on these machines, valid for the boot it was made in, instead
#     of probing the kernel (and running iptables) at every start.
# A marker next to the binary records the patches and flags built in.
#
# Idempotent: it does nothing when a criu >= 4.1 built with the current
# patches is installed and `criu check` passes. Run as root. Environment:
#   CRIU_VERSION   upstream version to build (default 4.1.1)
#   CRIU_PREFIX    install directory of the binary (default /usr/local/sbin)
set -euo pipefail

CRIU_VERSION=${CRIU_VERSION:-4.1.1}
CRIU_PREFIX=${CRIU_PREFIX:-/usr/local/sbin}
MIN_MAJOR=4
MIN_MINOR=1
MIRROR=http://deb.debian.org/debian
SOURCES_FILE=/etc/apt/sources.list.d/agentjail-trixie-src.sources
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PATCHES=("$HERE"/criu-*.patch)
MARKER="$CRIU_PREFIX/criu.agentjail-patches"
BUILD_DEPS=(libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
	python3-protobuf libnl-3-dev libnet1-dev libcap-dev libbsd-dev libnftables-dev
	libaio-dev uuid-dev pkg-config gcc make xz-utils dpkg-dev curl
	ca-certificates iptables patch)

# The installed binary must win over Debian's /usr/sbin/criu.
export PATH="$CRIU_PREFIX:$PATH"
export DEBIAN_FRONTEND=noninteractive

log() { printf 'build-criu: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

# criu_ok reports whether the criu on PATH is >= MIN_MAJOR.MIN_MINOR and
# passes `criu check` on this kernel.
criu_ok() {
	local out ver major minor
	command -v criu >/dev/null 2>&1 || return 1
	out=$(criu --version 2>/dev/null) || return 1
	ver=$(printf '%s\n' "$out" | sed -n 's/^Version: *\([0-9][0-9.]*\).*/\1/p' | head -n1)
	[ -n "$ver" ] || return 1
	major=${ver%%.*}
	minor=${ver#*.}
	minor=${minor%%.*}
	if ((major < MIN_MAJOR || (major == MIN_MAJOR && minor < MIN_MINOR))); then
		log "criu $ver at $(command -v criu) is older than $MIN_MAJOR.$MIN_MINOR"
		return 1
	fi
	if ! criu check >/dev/null 2>&1; then
		log "criu $ver at $(command -v criu) fails 'criu check'"
		return 1
	fi
	if [ "$(cat "$MARKER" 2>/dev/null)" != "$(patches_sum)" ]; then
		log "criu $ver at $(command -v criu) was not built with the current patches"
		return 1
	fi
	return 0
}

# MAKE_FLAGS: no TLS for the page server (unused here); without gnutls and
# the eight libraries it pulls in, every CRIU run starts 5 ms sooner.
MAKE_FLAGS=(NO_GNUTLS=1)

# patches_sum identifies the build: the patches it applies and its flags.
patches_sum() { { cat "${PATCHES[@]}"; echo "${MAKE_FLAGS[*]}"; } | sha256sum | cut -d' ' -f1; }

# missing_pkgs prints the packages of "$@" that are not installed.
missing_pkgs() {
	local p
	for p in "$@"; do
		if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
			printf '%s\n' "$p"
		fi
	done
}

# add_trixie_sources adds a deb-src entry for trixie (sources only: no
# binary package of trixie can be installed through it).
add_trixie_sources() {
	if [ -f "$SOURCES_FILE" ]; then
		return 0
	fi
	cat >"$SOURCES_FILE" <<EOF
# Added by agentjail's scripts/build-criu.sh: source packages of Debian 13
# (trixie), used to build CRIU >= 4.1 on Debian 12.
Types: deb-src
URIs: $MIRROR
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
}

# fetch_source downloads and unpacks the CRIU source into $1/src and checks
# the tarball against the signed trixie Sources index.
fetch_source() {
	local dir=$1 want sha got url
	(cd "$dir" && apt-get source --download-only "criu=$CRIU_VERSION-*" >/dev/null 2>&1) ||
		log "apt-get source criu failed (the .dsc may be missing on the mirror); downloading the upstream tarball"
	local tarball="$dir/criu_$CRIU_VERSION.orig.tar.xz"
	if [ ! -s "$tarball" ]; then
		url="$MIRROR/pool/main/c/criu/criu_$CRIU_VERSION.orig.tar.xz"
		curl -fsSL --retry 3 -o "$tarball" "$url" || die "downloading $url failed"
	fi
	# The checksum of the tarball as the signed trixie Sources index lists it.
	want="criu_$CRIU_VERSION.orig.tar.xz"
	sha=$(apt-cache showsrc criu 2>/dev/null |
		awk -v f="$want" '/^Checksums-Sha256:/{s=1;next} /^[^ ]/{s=0} s && $3==f {print $1; exit}')
	if [ -n "$sha" ]; then
		got=$(sha256sum "$tarball" | cut -d' ' -f1)
		[ "$got" = "$sha" ] || die "$want: sha256 $got does not match the trixie index ($sha)"
		log "$want: sha256 matches the signed trixie index"
	else
		die "$want is not listed in the trixie Sources index (apt-cache showsrc criu); cannot verify it"
	fi
	mkdir -p "$dir/src"
	tar -xJf "$tarball" -C "$dir/src" --strip-components=1
}

main() {
	[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and $CRIU_PREFIX/criu)"
	if criu_ok; then
		log "criu $(criu --version | sed -n 's/^Version: *//p') at $(command -v criu) works; nothing to do"
		return 0
	fi
	local start=$SECONDS
	add_trixie_sources
	local missing
	missing=$(missing_pkgs "${BUILD_DEPS[@]}")
	# The trixie Sources index is needed to verify the tarball; fetch the
	# lists when it is absent or build deps are missing.
	if [ -n "$missing" ] || ! apt-cache showsrc criu 2>/dev/null | grep -q "^Version: $CRIU_VERSION"; then
		log "apt-get update"
		apt-get update -qq
	fi
	if [ -n "$missing" ]; then
		log "installing build dependencies: $(echo $missing)"
		# shellcheck disable=SC2086 # one package per word
		apt-get install -y -qq --no-install-recommends $missing >/dev/null
	fi

	WORK=$(mktemp -d /var/tmp/agentjail-criu.XXXXXX)
	trap 'rm -rf "$WORK"' EXIT
	fetch_source "$WORK"
	local p
	for p in "${PATCHES[@]}"; do
		log "applying $(basename "$p")"
		patch -d "$WORK/src" -p1 --quiet <"$p" || die "$(basename "$p") does not apply"
	done
	log "building criu $CRIU_VERSION (make criu)"
	make -C "$WORK/src" -j"$(nproc)" "${MAKE_FLAGS[@]}" criu >"$WORK/build.log" 2>&1 || {
		tail -n 40 "$WORK/build.log" >&2
		die "make criu failed"
	}
	install -D -m 0755 "$WORK/src/criu/criu" "$CRIU_PREFIX/criu"
	patches_sum >"$MARKER"
	hash -r
	criu_ok || die "the built criu at $CRIU_PREFIX/criu does not pass 'criu check'"
	log "installed criu $CRIU_VERSION at $CRIU_PREFIX/criu in $((SECONDS - start)) s"
}

main "$@"
