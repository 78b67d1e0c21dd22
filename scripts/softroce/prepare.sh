#!/usr/bin/env bash
# Builds (once) what a Soft-RoCE guest needs: Debian's stock kernel and a busybox
# initramfs holding the closure of virtio-net, 9p and rdma_rxe's modules. Cached
# under ~/.cache/netreduce/softroce/<kernel version>; a no-op when the cache is
# complete. Needs root (apt-get). Prints the cache directory on its last line.
#   bash scripts/softroce/prepare.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache_root=${NETREDUCE_SOFTROCE_CACHE:-$HOME/.cache/netreduce/softroce}

pkgs=()
need() { command -v "$1" >/dev/null 2>&1 || pkgs+=("$2"); }
need qemu-system-x86_64 qemu-system-x86
need depmod kmod
need cpio cpio
need rdma rdma-core
need ibv_devinfo ibverbs-utils
need tshark tshark
[ -x /bin/busybox ] || pkgs+=(busybox-static)
[ -e /usr/include/infiniband/verbs.h ] || pkgs+=(libibverbs-dev)
[ -e /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ] || pkgs+=(ibverbs-providers)
if [ ${#pkgs[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "prepare.sh: need root to apt-get install ${pkgs[*]}" >&2; exit 2; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "${pkgs[@]}" >/dev/null 2>&1 || \
    { apt-get update -qq && apt-get install -y -qq "${pkgs[@]}" >/dev/null; }
fi

# The kernel the metapackage points at today (6.1.0-N-amd64 on bookworm).
kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
[ -n "$kpkg" ] || { apt-get update -qq; kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}'); }
kver=${kpkg#linux-image-}
cache=$cache_root/$kver
# The initramfs is current when it was built from these very scripts: their content
# hash, not their mtime (a fresh checkout or a worktree has new mtimes, same bytes).
want=$(cat "$here/guest_init.sh" "$here/build_initramfs.sh" | sha256sum | cut -d' ' -f1)
if [ -s "$cache/vmlinuz" ] && [ -s "$cache/initramfs.cpio.gz" ] && \
   [ "$(cat "$cache/initramfs.sha256" 2>/dev/null)" = "$want" ]; then
  echo "$cache"; exit 0
fi
mkdir -p "$cache"
work=$(mktemp -d "$cache_root/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
if [ ! -s "$cache/vmlinuz" ] || [ ! -d "$cache/modules" ]; then
  (cd "$work" && apt-get download -qq "$kpkg" >/dev/null)
  dpkg -x "$work"/linux-image-*.deb "$work/kern"
  rm -rf "$cache/modules"
  mkdir -p "$cache/modules/lib/modules"
  mv "$work/kern/lib/modules/$kver" "$cache/modules/lib/modules/"
  cp "$work/kern/boot/vmlinuz-$kver" "$cache/vmlinuz"
  depmod -b "$cache/modules" "$kver"   # the .deb ships no modules.dep
fi
# Built aside and renamed: a guest booting meanwhile reads the old image or the new.
bash "$here/build_initramfs.sh" "$cache/modules" "$kver" "$work/initramfs.cpio.gz"
mv "$work/initramfs.cpio.gz" "$cache/initramfs.cpio.gz"
echo "$want" > "$cache/initramfs.sha256"
echo "$cache"
