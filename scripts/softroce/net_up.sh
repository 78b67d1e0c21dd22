#!/usr/bin/env bash
# net_up.sh BRIDGE HOST_IP/CIDR TAP... : a bridge holding the host's address and one
# tap per guest (root). Idempotent; net_down.sh removes them.
set -euo pipefail
br=$1 addr=$2; shift 2
ip link show "$br" >/dev/null 2>&1 || ip link add "$br" type bridge
ip addr replace "$addr" dev "$br"
ip link set "$br" up
for tap in "$@"; do
  ip link show "$tap" >/dev/null 2>&1 || ip tuntap add dev "$tap" mode tap
  ip link set "$tap" master "$br"
  ip link set "$tap" up
done
