#!/usr/bin/env bash
# Installs the guest kernel of the vm isolation level: Debian's cloud kernel
# package, pinned, unpacked (nothing is installed into the host's /boot or
# /lib/modules) into $VM_DIR:
#
#   vmlinux       the uncompressed kernel (QEMU's microvm boots it by its
#                 PVH entry point)
#   modules/*.ko  the modules the guest's init loads, in modules/order
#   VERSION       the package, its version and the modules
#
# Idempotent: does nothing when VERSION names the pinned package. The daemon
# builds the initramfs itself (its init is the daemon's own binary).
set -euo pipefail

KERNEL_PKG=${KERNEL_PKG:-linux-image-6.1.0-50-cloud-amd64-unsigned}
KERNEL_VERSION=${KERNEL_VERSION:-6.1.176-1}
VM_DIR=${VM_DIR:-/usr/local/lib/agentjail/vm}
# Load order matters: each module after those it uses.
MODULES=(virtio virtio_ring virtio_mmio virtio_blk virtio_console failover net_failover virtio_net libcrc32c xfs erofs overlay)

log() { printf 'build-vm-kernel: %s\n' "$*" >&2; }

want="$KERNEL_PKG $KERNEL_VERSION ${MODULES[*]}"
if [ "$(cat "$VM_DIR/VERSION" 2>/dev/null)" = "$want" ] && [ -f "$VM_DIR/vmlinux" ]; then
	exit 0
fi
for tool in lz4 apt-get dpkg-deb; do
	command -v "$tool" >/dev/null || { log "error: $tool is missing (setup installs it)"; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
log "downloading $KERNEL_PKG=$KERNEL_VERSION"
if ! apt-get download "$KERNEL_PKG=$KERNEL_VERSION" >/dev/null 2>apt.err; then
	# The archive keeps only its current kernels: take the one the cloud
	# kernel metapackage names, and say so.
	KERNEL_PKG=$(apt-cache depends linux-image-cloud-amd64 | sed -n 's/.*Depends: \(linux-image-[0-9].*\)/\1/p' | head -1)
	KERNEL_PKG=${KERNEL_PKG%-unsigned}-unsigned
	KERNEL_VERSION=$(apt-cache policy "$KERNEL_PKG" | sed -n 's/ *Candidate: //p')
	log "warning: the pinned kernel is no longer in the archive ($(tr '\n' ' ' <apt.err)); using $KERNEL_PKG=$KERNEL_VERSION"
	want="$KERNEL_PKG $KERNEL_VERSION ${MODULES[*]}"
	apt-get download "$KERNEL_PKG=$KERNEL_VERSION" >/dev/null
fi
dpkg-deb -x ./*.deb x
vmlinuz=$(echo x/boot/vmlinuz-*)
# Debian compresses the kernel with LZ4 (legacy frame, magic 02 21 4c 18).
off=$(grep -obUaP '\x02\x21\x4c\x18' "$vmlinuz" | head -1 | cut -d: -f1)
[ -n "$off" ] || { log "error: no LZ4 payload in $vmlinuz"; exit 1; }
tail -c +$((off + 1)) "$vmlinuz" | lz4 -dc >vmlinux 2>/dev/null || true
file_magic=$(head -c 4 vmlinux | od -An -tx1 | tr -d ' ')
[ "$file_magic" = 7f454c46 ] || { log "error: the decompressed kernel is not an ELF file"; exit 1; }

mkdir -p out/modules
: >out/modules/order
for m in "${MODULES[@]}"; do
	ko=$(find x/lib/modules -name "$m.ko" | head -1)
	[ -n "$ko" ] || { log "error: module $m not in $KERNEL_PKG"; exit 1; }
	cp "$ko" out/modules/
	echo "$m.ko" >>out/modules/order
done
mv vmlinux out/vmlinux
echo "$want" >out/VERSION
mkdir -p "$(dirname "$VM_DIR")"
rm -rf "$VM_DIR.new"
mv out "$VM_DIR.new"
rm -rf "$VM_DIR"
mv "$VM_DIR.new" "$VM_DIR"
log "installed $want into $VM_DIR"
