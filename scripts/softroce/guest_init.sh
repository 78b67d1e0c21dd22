#!/bin/sh
# PID 1 of a Soft-RoCE guest (busybox). Loads the drivers, brings eth0 up with the
# address from the kernel command line (nr_ip=A.B.C.D/N), creates rxe0 on it, mounts
# the host's /usr, /etc and the repository read-only under /hostroot (9p) and the
# run directory read-write at /mnt/share (and /hostroot/mnt/share), runs
# /mnt/share/run.sh, writes its exit status to /mnt/share/rc and to the console as
# NR_GUEST_RC=<n>, and powers off.
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
stage() { echo "NR_STAGE $1 uptime=$(cut -d' ' -f1 /proc/uptime)"; }
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^$1=//p" | head -1; }
stage init
for m in virtio_pci virtio_net 9pnet_virtio 9p crc32_generic ib_uverbs ib_umad rdma_ucm rdma_rxe; do
  modprobe "$m" || echo "guest_init: modprobe $m failed"
done
stage modules
ip=$(arg nr_ip); mtu=$(arg nr_mtu); repo=$(arg nr_repo)
echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad 2>/dev/null
echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_dad 2>/dev/null
ip link set lo up
[ -n "$mtu" ] && ip link set eth0 mtu "$mtu"
ip addr add "$ip" dev eth0
ip link set eth0 up
mkdir -p /mnt/share
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share /mnt/share || echo "guest_init: no share"
hr=/hostroot
mkdir -p $hr
mount -t tmpfs tmp $hr
mkdir -p $hr/usr $hr/etc $hr/proc $hr/sys $hr/dev $hr/tmp $hr/mnt/share $hr/run $hr/root
# /tmp first: a repository (or share) under /tmp is mounted on top of it, not hidden by it
mount -t tmpfs tmp $hr/tmp
mkdir -p "$hr$repo"
for l in bin sbin lib lib64; do ln -s usr/$l $hr/$l; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostusr $hr/usr
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostetc $hr/etc
[ -n "$repo" ] && mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 repo "$hr$repo"
# Further host directories (a Python prefix outside /usr, ...), each at its own path.
n=0
for d in $(arg nr_extra | tr ',' ' '); do
  mkdir -p "$hr$d" && mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 "extra$n" "$hr$d"
  n=$((n+1))
done
mount --bind /mnt/share $hr/mnt/share
mount -t proc proc $hr/proc
mount -t sysfs sys $hr/sys
mount -t devtmpfs dev $hr/dev
chroot $hr /usr/bin/rdma link add rxe0 type rxe netdev eth0 || echo "guest_init: rdma link add failed"
# The IPv4-mapped RoCEv2 GID appears once the address is on the link.
i=0
while [ $i -lt 100 ] && [ -d /sys/class/infiniband/rxe0 ] && ! grep -qs ffff /sys/class/infiniband/rxe0/ports/1/gids/1; do sleep 0.1; i=$((i+1)); done
stage rxe
if [ -f /mnt/share/run.sh ]; then
  sh /mnt/share/run.sh > /mnt/share/out.log 2>&1
  rc=$?
else
  echo "guest_init: no /mnt/share/run.sh"; rc=253
fi
echo $rc > /mnt/share/rc
sync
stage done
echo "NR_GUEST_RC=$rc"
poweroff -f
