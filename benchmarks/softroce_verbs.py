#!/usr/bin/env python3
"""Verbs vs UDP transport inside a Soft-RoCE guest (issue 13), in one boot.

One QEMU guest (TCG, 1 vCPU; scripts/softroce/run_guest.sh) runs a worker that
all-reduces the same buffers through an aggregator on the host three times per
round: on the verbs transport over an RC and over a UC queue pair of rxe0, and on
the UDP transport (a kernel socket on the guest's eth0), in rotating order for
--rounds rounds. Both jobs use
the same payload (the aggregator runs with --payload-bytes 992, the most a verbs
result packet carries at rxe's 1024-byte MTU), so the figures compare per-packet
costs: the worker process's CPU seconds (user + system, getrusage) per GB reduced,
and the throughput (GB reduced per wall second). Root only.

    python3 benchmarks/softroce_verbs.py --mib 4 --repeat 8 --rounds 2

TCG emulates every guest instruction: the figures compare the two transports on
the same emulated CPU and say nothing about hardware RoCE NICs."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netreduce.switch import spawn  # noqa: E402
from tests.softroce.harness import REPO, SoftRoceBed, guest_env, guest_python  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=float, default=4.0, help="MiB per all-reduce (float32)")
    ap.add_argument("--repeat", type=int, default=8, help="all-reduces per measurement")
    ap.add_argument("--rounds", type=int, default=2, help="verbs/udp alternations")
    ap.add_argument("--out", default="", help="write the raw records (JSON) here")
    args = ap.parse_args()
    started, load0 = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), list(os.getloadavg())
    if os.geteuid() != 0:
        print("softroce_verbs.py: needs root (tap, bridge, qemu)", file=sys.stderr)
        return 2
    count = int(args.mib * (1 << 20) / 4)
    work = Path(tempfile.mkdtemp(prefix="nr-softroce-bench-"))
    rundir = work / "guest"
    with SoftRoceBed(work) as bed:
        agg = spawn(host=bed.host_ip, port=4791, threads=1, payload_bytes=992,
                    extra_args=["--allow-open-jobs"])
        try:
            phases = []
            kinds = {"verbs-rc": {"NETREDUCE_TRANSPORT": "verbs", "NETREDUCE_VERBS_QP": "rc"},
                     "verbs-uc": {"NETREDUCE_TRANSPORT": "verbs", "NETREDUCE_VERBS_QP": "uc"},
                     "udp": {"NETREDUCE_TRANSPORT": "udp"}}
            order = list(kinds)
            for r in range(args.rounds):
                for kind in order[r % 3:] + order[:r % 3]:  # rotate: no kind always first
                    phases.append({"switch": f"{bed.host_ip}:4791", "job": f"{kind}-{r}",
                                   "rank": 0, "size": 1, "repeat": args.repeat, "env": kinds[kind],
                                   "cases": [["float32", 1024], ["float32", count]]})
            rundir.mkdir()
            (rundir / "plan.json").write_text(json.dumps({"phases": phases}))
            worker = REPO / "tests" / "softroce" / "guest_worker.py"
            script = (f"export {guest_env()}\ncd /tmp\n"
                      f"chroot /hostroot {guest_python()} {worker} /mnt/share/plan.json "
                      f"/mnt/share/result.json\n")
            rc = bed.boot(rundir, script, timeout=900)
        finally:
            agg.stop()
    result = json.loads((rundir / "result.json").read_text())
    if rc != 0 or not result["ok"]:
        print(f"guest failed (rc {rc}); see {rundir}/out.log", file=sys.stderr)
        return 1
    rows = {}
    for p in result["phases"]:
        case = p["cases"][-1]  # the first (1024 elements) only warms the path up
        gb = case["bytes"] / 1e9
        kind = p["job"].rsplit("-", 1)[0]
        assert (kind == "udp") == (p["transport"] == "udp"), p["transport"]
        rows.setdefault(kind, []).append(
            {"gb": gb, "cpu_s_per_gb": case["cpu_s"] / gb, "gb_per_s": gb / case["wall_s"],
             "packets_sent": p["stats"]["packets_sent"], "retransmits": p["stats"]["retransmits"]})
    print(f"{args.mib:g} MiB float32 x {args.repeat} per measurement, payload 992 B, "
          f"{args.rounds} rounds; guest: QEMU TCG, 1 vCPU")
    print(f"{'transport':>9} {'CPU s/GB':>10} {'Gbit/s':>8}  (median; per round CPU s/GB / Gbit/s)")
    med = {}
    for t, rs in rows.items():
        cpu = sorted(r["cpu_s_per_gb"] for r in rs)
        thr = sorted(r["gb_per_s"] * 8 for r in rs)
        med[t] = (cpu[(len(cpu) - 1) // 2], thr[len(thr) // 2])  # lower / upper median
        print(f"{t:>9} {med[t][0]:>10.1f} {med[t][1]:>8.3f}  "
              + ", ".join(f"{r['cpu_s_per_gb']:.1f}/{r['gb_per_s'] * 8:.3f}" for r in rs))
    for kind in ("verbs-rc", "verbs-uc"):
        if kind in med and "udp" in med:
            print(f"{kind}/udp: CPU per GB {med[kind][0] / med['udp'][0]:.2f}x, "
                  f"throughput {med[kind][1] / med['udp'][1]:.2f}x")
    if args.out:  # the medians as printed, every round, and when and under what load
        Path(args.out).write_text(json.dumps({
            "command": "python3 benchmarks/softroce_verbs.py " + " ".join(sys.argv[1:]),
            "args": vars(args), "utc_start": started, "load_start": load0,
            "load_end": list(os.getloadavg()), "medians": {
                t: {"cpu_s_per_gb": m[0], "gbit_per_s": m[1]} for t, m in med.items()},
            "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
