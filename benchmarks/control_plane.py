#!/usr/bin/env python3
"""Control-plane benchmark (issue 15): how the coordinator scales, and what a steady
training step costs when cached tensors are agreed on through the data plane.

    PYTHONPATH=. python benchmarks/control_plane.py scale --ranks 1000 --procs 4
    PYTHONPATH=. python benchmarks/control_plane.py step --before /tmp/nr-before
    PYTHONPATH=. python benchmarks/control_plane.py join --ranks 1000 --procs 4

``scale``: one real netreduce-switch; ``--ranks`` lightweight simulated ranks (the
real rank-side NegotiationClient, one control connection each, no data plane) in
``--procs`` processes. Reports the job start time (first connection to the last
rank's hello returning: every rank knows every rank joined) and the negotiation
time per step through the coordinator: every rank submits one tensor (by its cache
id after the first step) and waits for its log entry — the path a cache miss takes.
``--rounds`` adds the agreement path at that scale: the same ranks open real data
planes and time the agreement round (the int32 MIN all-reduce of the cache vector).

``join``: one real netreduce-switch; ``--ranks`` rank threads in ``--procs``
processes, each running what ``nr.init()`` runs on a rank with the project's own
classes: data-plane admission (``dataplane.connect``: register, the payload, the
native engine) and then the hello (``NegotiationClient``: returns once every rank
joined). Then every rank's first all-reduce, 16 int32 (rank r gives r), checked
exact on every rank. Reports the full join (first connection to the last hello),
the first all-reduce (last hello to the last result), the engines' resends and
the CPU used, per run (``--repeat``) and as medians with the spread; ``--before``
runs an earlier checkout interleaved with this one (the same load for both).

``step``: N=4 ranks on this host through the public API (nr.allreduce of 4 KiB,
float32, one name), the median of ``--repeat`` runs of ``--iters`` each, for
every variant in the same run: ``before`` (the code at ``--before``, a worktree of
the previous commit with the same native module), ``coordinator``
(NETREDUCE_CACHE_AGREEMENT=0: every step asks the coordinator), ``agreement``
(the default); each at NETREDUCE_CYCLE_TIME 1 (default) and 0, and with the
algorithm the host gets by default (auto: one host = shared memory) and flat (every
rank through the aggregator). ``dataplane`` is the same 4 KiB all-reduce on the
algorithm alone, no negotiation, for the floor. ``failover-coordinator`` and
``failover-agreement`` (``--variants``) are the last two with failover on
(NETREDUCE_STANDBY_SWITCH = the job's own aggregator; negotiation at rank 0).
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path and not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, REPO)  # workers get PYTHONPATH: "before" runs the other checkout

from control_plane_join import drive_join, worker_join  # noqa: E402  (benchmarks/ is sys.path[0])
from control_plane_scale import drive_scale_runs, worker_scale  # noqa: E402
from control_plane_step import drive_step, worker_step  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("scale")
    s.add_argument("--ranks", type=int, default=1000)
    s.add_argument("--procs", type=int, default=4)
    s.add_argument("--steps", type=int, default=20)
    s.add_argument("--rounds", action="store_true")
    s.add_argument("--repeat", type=int, default=1)
    s.add_argument("--json", default="")
    st = sub.add_parser("step")
    st.add_argument("--np", type=int, default=4)
    st.add_argument("--iters", type=int, default=1000)
    st.add_argument("--warmup", type=int, default=100)
    st.add_argument("--repeat", type=int, default=3)
    st.add_argument("--before", default="")
    st.add_argument("--variants", default="before,coordinator,agreement,dataplane")
    st.add_argument("--cycles", default="1,0")
    st.add_argument("--algorithms", default="auto,flat")
    st.add_argument("--json", default="")
    j = sub.add_parser("join")
    j.add_argument("--ranks", type=int, default=1000)
    j.add_argument("--procs", type=int, default=4)
    j.add_argument("--repeat", type=int, default=3)
    j.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment of the rank processes (e.g. NETREDUCE_RETRANSMIT_MS=1)")
    j.add_argument("--switch-args", default="", help="extra netreduce-switch options")
    j.add_argument("--code", default="",
                   help="run the daemon and the ranks from this checkout (e.g. a worktree of "
                        "an earlier commit with the same native module); default: this one")
    j.add_argument("--before", default="",
                   help="also run this checkout (an earlier commit, same native module or "
                        "its own), interleaved with this one in every repeat")
    j.add_argument("--no-hello", action="store_true",
                   help="each rank's first all-reduce right after its admission (no "
                        "negotiation hello): the first sum then waits for the last rank's "
                        "engine to start, not for the last hello")
    j.add_argument("--json", default="")
    wj = sub.add_parser("worker-join")
    for a in ("--switch", "--job"):
        wj.add_argument(a, required=True)
    for a in ("--size", "--first", "--count"):
        wj.add_argument(a, type=int, required=True)
    wj.add_argument("--no-hello", action="store_true")
    w = sub.add_parser("worker-scale")
    for a in ("--switch", "--job"):
        w.add_argument(a, required=True)
    for a in ("--size", "--first", "--count", "--steps"):
        w.add_argument(a, type=int, required=True)
    w.add_argument("--rounds", action="store_true")
    ws = sub.add_parser("worker-step")
    ws.add_argument("--iters", type=int, default=1000)
    ws.add_argument("--warmup", type=int, default=100)
    ws.add_argument("--raw", action="store_true")
    args = p.parse_args()
    {"scale": drive_scale_runs, "step": drive_step, "join": drive_join, "worker-scale": worker_scale,
     "worker-step": worker_step, "worker-join": worker_join}[args.mode](args)


if __name__ == "__main__":
    main()
