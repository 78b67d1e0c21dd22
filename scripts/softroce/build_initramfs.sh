#!/usr/bin/env bash
# build_initramfs.sh MODULES_ROOT KVER OUT.cpio.gz
# A busybox initramfs with the closure (modules.dep) of the drivers a Soft-RoCE guest
# needs, and guest_init.sh as /init. Userland beyond busybox comes from the host's
# /usr over 9p at run time (guest_init.sh), so nothing else is copied in.
set -euo pipefail
mods_root=$1 kver=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,sbin,proc,sys,dev,mnt,tmp,hostroot,lib/modules/$kver}
cp /bin/busybox "$root/bin/busybox"
for app in $("$root/bin/busybox" --list); do
  [ "$app" = busybox ] || ln -sf busybox "$root/bin/$app"
done
moddir=$mods_root/lib/modules/$kver
want="virtio_pci virtio_net 9pnet_virtio 9p crc32_generic rdma_rxe ib_uverbs ib_umad rdma_ucm"
declare -A seen=()
add() {  # a module name or path, and what it depends on
  local rel
  rel=$(awk -F: -v m="$1" '{n=$1; sub(/.*\//,"",n); sub(/\.ko(\.[a-z]+)?$/,"",n); gsub(/-/,"_",n); mm=m; gsub(/-/,"_",mm); if (n==mm) {print $1; exit}}' "$moddir/modules.dep")
  [ -n "$rel" ] || { echo "build_initramfs.sh: module $1 not in $kver" >&2; return 0; }
  [ -n "${seen[$rel]:-}" ] && return 0
  seen[$rel]=1
  mkdir -p "$root/lib/modules/$kver/$(dirname "$rel")"
  cp "$moddir/$rel" "$root/lib/modules/$kver/$rel"
  local dep
  for dep in $(awk -F: -v r="$rel" '$1==r{print $2; exit}' "$moddir/modules.dep"); do
    local n=${dep##*/}; n=${n%%.ko*}; add "$n"
  done
}
for m in $want; do add "$m"; done
cp "$moddir"/modules.{order,builtin,builtin.modinfo} "$root/lib/modules/$kver/" 2>/dev/null || true
depmod -b "$root" "$kver"
cp "$here/guest_init.sh" "$root/init"
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$out.tmp"
mv "$out.tmp" "$out"
