"""`netreduce-testbed`: build, use and remove an emulated cluster (root only).

    netreduce-testbed up --hosts 4 --rate 1gbit [--loss 0.01]
    netreduce-testbed run --host 0 -- python -c 'print("hello from h0")'
    netreduce-testbed run --host agg -- netreduce-switch --host 10.77.0.250 --allow-open-jobs
    netreduce-testbed status
    netreduce-testbed down
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from netreduce.testbed.plan import TestbedError
from netreduce.testbed.testbed import Testbed, leftovers, teardown


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="netreduce-testbed",
        description="Emulate N hosts and an aggregator on one Linux machine: one network "
                    "namespace each, joined by a bridge (the switch), every link shaped with "
                    "tc tbf, optional random loss with nftables. Needs root. See docs/testbed.md.")
    ap.add_argument("--name", default="nrtb",
                    help="testbed name, prefix of its namespaces and links (1-9 chars; default nrtb)")
    sub = ap.add_subparsers(dest="cmd", required=True)

    up = sub.add_parser("up", help="create the testbed (and leave it running)")
    up.add_argument("--hosts", type=int, default=4, help="number of host namespaces h0..hN-1 (default 4)")
    up.add_argument("--rate", default="1gbit",
                    help="each host link's rate, each direction, tc syntax: 500mbit, 1gbit (default 1gbit)")
    up.add_argument("--aggregator-rate", default=None,
                    help="the aggregator's link rate (default hosts x rate, like a switch)")
    up.add_argument("--loss", type=float, default=0.0,
                    help="fraction of IP packets each namespace drops on arrival (default 0)")
    up.add_argument("--loss-proto", choices=("all", "udp", "tcp"), default="all",
                    help="which packets the loss rule may drop (default all)")
    up.add_argument("--mtu", type=int, default=9000,
                    help="MTU of every link (default 9000: a 4 KiB RoCE payload fits one frame)")
    up.add_argument("--queue-ms", type=float, default=50.0,
                    help="queue behind each shaper, in ms of line rate; beyond it packets drop (default 50)")
    up.add_argument("--subnet", default="10.77.0.0/24",
                    help="IPv4 /24 for the testbed: hosts .1-.N, aggregator .250, bridge .254")
    up.add_argument("--ipv6", action="store_true",
                    help="also give every node an IPv6 address (fd00:A:B:C::/64 named after --subnet, "
                         "same last number: aggregator ::fa)")
    up.add_argument("--replace", action="store_true", help="tear down a testbed of the same name first")

    run = sub.add_parser("run", help="run a command inside a host's namespace")
    run.add_argument("--host", required=True, help="host index 0..N-1, or 'agg' for the aggregator")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")

    sub.add_parser("status", help="print the testbed's layout, wire counters and drops")
    sub.add_parser("down", help="remove the testbed: processes in it, namespaces, links, bridge")
    return ap


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except TestbedError as exc:
        print(f"netreduce-testbed: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _dispatch(args) -> int:
    from netreduce.testbed.sh import require_usable

    if args.cmd == "up":
        tb = Testbed(args.hosts, args.rate, name=args.name, subnet=args.subnet,
                     aggregator_rate=args.aggregator_rate, mtu=args.mtu, queue_ms=args.queue_ms,
                     loss=args.loss, loss_proto=args.loss_proto, replace=args.replace,
                     ipv6=args.ipv6)
        tb.up()  # a failure half-way tears down what was built before raising
        print(tb.describe())
        print(f"run commands with: netreduce-testbed --name {args.name} run --host 0 -- CMD ...; "
              f"remove with: netreduce-testbed --name {args.name} down")
        return 0
    if args.cmd == "down":
        require_usable(("ip",))
        removed = teardown(args.name)
        left = leftovers(args.name)
        print(f"testbed {args.name}: removed {len(removed)} item(s)" + (f": {', '.join(removed)}" if removed else ""))
        if left:
            print(f"still present: {', '.join(left)}", file=sys.stderr)
            return 1
        return 0
    if args.cmd == "status":
        tb = Testbed.attach(args.name)
        print(tb.describe())
        counters, drops, qdrops = tb.counters(), tb.loss_drops(), tb.qdisc_drops()
        print(f"  {'node':>4}  {'tx bytes':>14} {'rx bytes':>14} {'loss drops':>10} {'queue drops':>11}")
        for name, c in counters.items():
            print(f"  {name:>4}  {c['tx_bytes']:>14} {c['rx_bytes']:>14} {drops[name]:>10} {qdrops[name]:>11}")
        return 0
    if args.cmd == "run":
        cmd = list(args.argv)
        if cmd and cmd[0] == "--":
            cmd = cmd[1:]
        if not cmd:
            raise TestbedError("run needs a command after --, e.g. run --host 0 -- ip addr")
        tb = Testbed.attach(args.name)
        full = tb.exec_argv(args.host, cmd)
        sys.stdout.flush()
        os.execvp(full[0], full)  # the command's exit status becomes ours
    raise AssertionError(args.cmd)


if __name__ == "__main__":
    sys.exit(main())
