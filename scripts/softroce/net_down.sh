#!/usr/bin/env bash
# net_down.sh BRIDGE TAP... : removes what net_up.sh created (missing ones are fine).
br=$1; shift
for tap in "$@"; do ip link del "$tap" 2>/dev/null; done
ip link del "$br" 2>/dev/null
exit 0
