#!/usr/bin/env bash
# run_guest.sh RUNDIR TAP IP/CIDR [TIMEOUT_S]
# Boots one Soft-RoCE guest (TCG) on tap TAP with eth0 = IP/CIDR, shares RUNDIR
# read-write (/mnt/share in the guest, also inside the /hostroot chroot), the host's
# /usr and /etc read-only, and the repository (NR_REPO, default: this checkout) at the
# same path, so `chroot /hostroot python3 ...` runs the project's own build against
# rxe0. Runs RUNDIR/run.sh in the guest and exits with its status (254: the guest
# hung past TIMEOUT_S, 255: it ended without reporting one).
# Logs: RUNDIR/out.log (run.sh's output), RUNDIR/console.log (serial console).
set -uo pipefail
rundir=$(cd "$1" && pwd) tap=$2 ip=$3 limit=${4:-600}
here=$(cd "$(dirname "$0")" && pwd)
repo=${NR_REPO:-$(cd "$here/../.." && pwd)}
cache=$(bash "$here/prepare.sh" | tail -1) || exit 2
accel=${NR_ACCEL:-tcg,thread=single}
cpu=${NR_CPU:-max}
rm -f "$rundir/rc"
# NR_EXTRA_SHARES: colon-separated host directories shared read-only at their own path.
extra=() extra_arg=
n=0
IFS=: read -ra dirs <<< "${NR_EXTRA_SHARES:-}"
for d in "${dirs[@]}"; do
  [ -d "$d" ] || continue
  extra+=(-virtfs "local,path=$d,mount_tag=extra$n,security_model=none,readonly=on,id=extra$n")
  extra_arg=${extra_arg:+$extra_arg,}$d
  n=$((n+1))
done
mac=52:54:00:$(printf '%02x:%02x:%02x' $((RANDOM % 256)) $((RANDOM % 256)) $((RANDOM % 256)))
timeout --kill-after=5 "$limit" qemu-system-x86_64 -accel "$accel" -cpu "$cpu" \
  -smp "${NR_SMP:-1}" -m "${NR_MEM_MB:-1024}" -nodefaults -no-reboot -display none \
  -kernel "$cache/vmlinuz" -initrd "$cache/initramfs.cpio.gz" \
  -append "console=ttyS0 quiet panic=-1 nr_ip=$ip nr_repo=$repo nr_mtu=${NR_MTU:-1500} nr_extra=$extra_arg" \
  -netdev tap,id=n0,ifname="$tap",script=no,downscript=no \
  -device virtio-net-pci,netdev=n0,mac="$mac" \
  -virtfs local,path="$rundir",mount_tag=share,security_model=none,id=share \
  -virtfs local,path=/usr,mount_tag=hostusr,security_model=none,readonly=on,id=hostusr \
  -virtfs local,path=/etc,mount_tag=hostetc,security_model=none,readonly=on,id=hostetc \
  -virtfs local,path="$repo",mount_tag=repo,security_model=none,readonly=on,id=repo \
  "${extra[@]}" \
  -serial file:"$rundir/console.log" </dev/null >"$rundir/qemu.log" 2>&1
qrc=$?
if [ -s "$rundir/rc" ]; then exit "$(cat "$rundir/rc")"; fi
rc=$(sed -n 's/.*NR_GUEST_RC=\([0-9]*\).*/\1/p' "$rundir/console.log" 2>/dev/null | tail -1)
[ -n "$rc" ] && exit "$rc"
[ $qrc = 124 ] || [ $qrc = 137 ] && exit 254
exit 255
