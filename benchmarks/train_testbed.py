"""The training benchmark on the emulated testbed (benchmarks/train.py --testbed;
docs/testbed.md): rank r in testbed host r // --per-host, links shaped to --rate,
every mode in one run. Ranks are started directly in their namespaces (no launcher),
as benchmarks/allreduce.py --testbed does; this file sets each mode's environment,
collects rank 0's RESULT line with the shapers' and sockets' drops, and writes the
Markdown report, the JSON records and the plot."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
if ROOT not in sys.path:
    sys.path.insert(1, ROOT)

import allreduce_launch as launch  # noqa: E402  (free_port, worker_env, wait_all)
import common  # noqa: E402
import train_rank  # noqa: E402

TESTBED_OUT = os.path.join(HERE, "results", "train_testbed")
BASELINES = ("ddp-gloo", "hvd-gloo")


def _udp_socket_drops(tb) -> int:
    """UDP datagrams the kernel dropped for a full socket buffer, all namespaces."""
    total = 0
    for node in [*tb.hosts, tb.aggregator]:
        text = tb.run(node, ["cat", "/proc/net/snmp"], capture_output=True, text=True).stdout
        rows = [line.split() for line in text.splitlines() if line.startswith("Udp:")]
        if len(rows) >= 2:
            total += int(dict(zip(rows[0][1:], rows[1][1:])).get("RcvbufErrors", 0))
    return total


def run_one_testbed(tb, mode: str, model: str, n: int, args: argparse.Namespace) -> Dict:
    """One (mode, model) run, rank r in testbed host r; rank 0's RESULT line + the
    shapers' queue drops during the run."""
    record = {"mode": mode, "model": model, "ranks": n}
    L = args.per_host  # ranks per emulated host: rank r runs in host r // L
    if mode == "hvd-gloo":
        missing = common.horovod_missing()
        if missing:
            return dict(record, error=missing)
    tmp = tempfile.mkdtemp(prefix=f"nrtrain-{mode}-")
    me = train_rank.argv(mode, model, args, "--no-init-sync")
    common_env = {"OMP_NUM_THREADS": str(args.threads), "NRBENCH_IFNAME": tb.ifname,
                  "PYTHONUNBUFFERED": "1"}
    per_rank: List[Dict[str, str]] = [{} for _ in range(n)]
    cleanup = []
    logs = [os.path.join(tmp, f"rank{r}.log") for r in range(n)]
    try:
        if mode.startswith("nr-"):
            sw = tb.spawn_switch(args=shlex.split(args.switch_args))
            cleanup.append(sw.stop)
            common_env.update(NETREDUCE_SWITCH=f"{sw.address[0]}:{sw.address[1]}",
                              NETREDUCE_JOB=f"train-{uuid.uuid4().hex[:8]}",
                              NETREDUCE_SIZE=str(n), NETREDUCE_LOCAL_SIZE=str(L))
            per_rank[0]["NRBENCH_SWITCH_PID"] = str(sw.pid)
            for r in range(n):
                per_rank[r].update(NETREDUCE_RANK=str(r), NETREDUCE_LOCAL_RANK=str(r % L))
        if mode in ("nr-ddp", "nr-hook", "ddp-gloo"):
            # TCPStore in host 0's namespace, reached over the emulated links.
            common_env.update(MASTER_ADDR=tb.hosts[0].address, MASTER_PORT=str(launch.free_port()),
                              WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(L))
            for r in range(n):
                per_rank[r].update(RANK=str(r), LOCAL_RANK=str(r % L))
        if mode in ("nr-hook", "ddp-gloo", "hvd-gloo"):
            common_env["GLOO_SOCKET_IFNAME"] = tb.ifname
        if mode == "hvd-gloo":
            from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
            from horovod.runner.http.http_server import RendezvousServer
            rdv = RendezvousServer(verbose=0)
            port = rdv.start()
            cleanup.append(rdv.stop)
            plan = get_host_assignments(parse_hosts(",".join(f"h{i}:{L}" for i in range(n // L))), n)
            rdv.init(plan)
            common_env.update(HOROVOD_GLOO_RENDEZVOUS_ADDR=tb.plan.bridge_address,
                              HOROVOD_GLOO_RENDEZVOUS_PORT=str(port), HOROVOD_CONTROLLER="gloo",
                              HOROVOD_CPU_OPERATIONS="gloo", HOROVOD_GLOO_IFACE=tb.ifname)
            for r, slot in enumerate(plan):
                per_rank[r].update(
                    HOROVOD_HOSTNAME=slot.hostname, HOROVOD_RANK=str(slot.rank),
                    HOROVOD_SIZE=str(slot.size), HOROVOD_LOCAL_RANK=str(slot.local_rank),
                    HOROVOD_LOCAL_SIZE=str(slot.local_size), HOROVOD_CROSS_RANK=str(slot.cross_rank),
                    HOROVOD_CROSS_SIZE=str(slot.cross_size))
        drops0 = sum(tb.qdisc_drops().values())
        sock0 = _udp_socket_drops(tb)
        procs = []
        for r in range(n):
            env = launch.worker_env(dict(common_env, **per_rank[r]))
            with open(logs[r], "w") as log:
                procs.append(tb.popen(r // L, me, env=env, cwd=ROOT, stdout=log,
                                      stderr=subprocess.STDOUT))
        t0 = time.monotonic()
        try:
            launch.wait_all(procs, args.timeout, f"{mode} {model} N={n}")
        except RuntimeError as exc:
            return dict(record, error=f"{exc}: rank 0: {common.log_tail(logs[0], 4, 400)}")
        record["wall_s"] = time.monotonic() - t0
        record["queue_drops"] = sum(tb.qdisc_drops().values()) - drops0
        record["socket_drops"] = _udp_socket_drops(tb) - sock0
        if mode.startswith("nr-"):  # were the retransmissions needed? (whole run)
            from netreduce.protocol.client import ControlClient
            with ControlClient(sw.address) as c:
                g = c.call("counters")["global"]
            record["switch"] = {k: g[k] for k in ("packets_in", "duplicates",
                                                  "retransmitted_results", "drops")}
        with open(logs[0], errors="replace") as f:
            for line in f:
                if "RESULT " in line:
                    return dict(record, **json.loads(line.split("RESULT ", 1)[1]))
        return dict(record, error=f"no RESULT from rank 0: {common.log_tail(logs[0], 4, 400)}")
    finally:
        common.run_cleanups(cleanup)
        shutil.rmtree(tmp, ignore_errors=True)


def _median(values: List[float]) -> Optional[float]:
    values = sorted(values)
    if not values:
        return None
    k = len(values) // 2
    return values[k] if len(values) % 2 else (values[k - 1] + values[k]) / 2


def testbed_summary(records: List[Dict], models: List[str], modes: List[str]) -> Dict:
    """{model: {mode: median samples/s}} and {model: {nr-mode: {baseline: speed-up}}}."""
    rates, speedups = {}, {}
    for model in models:
        rates[model] = {m: _median([r["samples_per_s"] for r in records if r["model"] == model
                                    and r["mode"] == m and "error" not in r]) for m in modes}
        speedups[model] = {}
        for nr in (m for m in modes if m.startswith("nr-")):
            for base in (m for m in modes if not m.startswith("nr-")):
                a, b = rates[model][nr], rates[model][base]
                if a and b:
                    speedups[model].setdefault(nr, {})[base] = a / b
    return {"samples_per_s": rates, "speedup": speedups}


def _link_seconds(r: Dict, rate: str) -> Optional[float]:
    """Seconds per step rank 0's shaped link needs for the bytes it carried."""
    if "wire_tx_per_step" not in r:
        return None
    from netreduce.testbed import parse_rate
    return max(r["wire_tx_per_step"], r["wire_rx_per_step"]) * 8 / parse_rate(rate)


def testbed_markdown(meta: Dict, records: List[Dict], summary: Dict) -> str:
    m = meta["machine"]
    modes, models = meta["modes"], meta["models"]
    la0 = "/".join(f"{x:.2f}" for x in meta["loadavg_at_start"])
    la1 = "/".join(f"{x:.2f}" for x in meta["loadavg_at_end"])
    out = [
        "# Training throughput on the emulated testbed: netreduce vs DDP-gloo vs Horovod-gloo",
        "",
        f"- date: {meta['date']} (run took {meta['duration_s']:.0f} s)",
        f"- command: `{meta['command']}`",
        f"- machine: {m.get('cpu')} x{m.get('cores')} cores, {m.get('memory_gib')} GiB, kernel "
        f"{m.get('kernel')}; Python {m.get('python')}, torch {m.get('torch')}, horovod "
        f"{m.get('horovod')}",
        f"- load average (1/5/15 min) at start: {la0}; at end: {la1}"
        + (" (1-min value every 10 s during the run: %.2f–%.2f)" % tuple(meta["loadavg_1min_during"])
           if meta.get("loadavg_1min_during") else "") + "; 2 cores shared with other work",
        f"- testbed: {meta['ranks'] // meta.get('per_host', 1)} host namespaces + aggregator "
        f"namespace on a bridge, each "
        f"host link shaped to **{meta['rate']}** each way (tc tbf), aggregator link "
        f"{meta['ranks'] // meta.get('per_host', 1)} x that, MTU 9000, no loss; "
        f"{meta.get('per_host', 1)} rank(s) per host namespace, netreduce's "
        "aggregator (netreduce-switch, payload 8192 B) alone in its namespace "
        f"{('(switch args `' + meta['switch_args'] + '`)') if meta['switch_args'] else ''}",
        f"- training: batch {meta['batch']} per rank, 64x64 synthetic images, 1000 classes, "
        f"SGD momentum 0.9, {meta['threads']} torch thread per rank, {meta['warmup']} warm-up + "
        f"{meta['steps']} timed steps; samples/s = N x batch x steps / rank 0's time between "
        f"barriers; {meta['repeat']} run(s) per cell (median shown), modes interleaved; "
        "every rank builds the model from seed 0, so the initial parameter broadcast "
        "(outside the timed window) is skipped to keep the run short",
        "- modes: nr-hvd = netreduce.torch Horovod API (DistributedOptimizer); nr-ddp = DDP "
        "on the \"netreduce\" torch.distributed backend; ddp-gloo = DDP on gloo; hvd-gloo = "
        "Horovod 0.28.1 with Gloo",
        "",
        "## samples/s (higher is better)",
        "",
        "| model | params | gradient MB/step | " + " | ".join(modes) + " |",
        "|---|---|---|" + "---|" * len(modes),
    ]
    for model in models:
        params = next((r["params"] for r in records if r["model"] == model and "params" in r), 0)
        cells = []
        for mode in modes:
            vals = sorted(r["samples_per_s"] for r in records
                          if (r["model"], r["mode"]) == (model, mode) and "error" not in r)
            med = summary["samples_per_s"][model][mode]
            if med is None:
                cells.append("—")
            elif len(vals) == 1:
                cells.append(f"{med:.2f}")
            else:
                cells.append(f"**{med:.2f}** ({vals[0]:.2f}–{vals[-1]:.2f})")
        out.append(f"| {model} | {params / 1e6:.1f} M | {params * 4 / 1e6:.0f} | "
                   + " | ".join(cells) + " |")
    out += ["", "## speed-up of netreduce (netreduce samples/s / baseline samples/s)", "",
            f"Target (issue 5): AlexNet-like at N = {meta['ranks']} >= 1.5x both baselines. "
            f"Pure-communication bound at N = {meta['ranks']}: a ring moves 2(N-1)/N = "
            f"{2 * (meta['ranks'] - 1) / meta['ranks']:.2f} x the gradient bytes per host each "
            "way, in-network aggregation 1 x.", ""]
    bases = [b for b in modes if not b.startswith("nr-")]
    out += ["| model | netreduce mode | " + " | ".join(f"vs {b}" for b in bases) + " |",
            "|---|---|" + "---|" * len(bases)]
    for model in models:
        for nr, row in summary["speedup"][model].items():
            out.append(f"| {model} | {nr} | " + " | ".join(
                f"{row[b]:.2f}x" if b in row else "—" for b in bases) + " |")
    target = [(nr, b, v) for nr, row in summary["speedup"].get("alexnet", {}).items()
              for b, v in row.items()]
    if target:
        out += ["", "Target check (AlexNet-like, N = %d, >= 1.50x):" % meta["ranks"], ""]
        for nr, b, v in target:
            verdict = "met" if v >= 1.5 else f"missed by {1.5 - v:.2f}x ({(1.5 - v) / 1.5:.0%})"
            out.append(f"- {nr} vs {b}: {v:.2f}x — {verdict}")
    out += ["", "## per run: rank 0's link and CPU over the timed window", "",
            "wire = bytes rank 0's host link carried per step each way (veth counters, whole "
            "frames), over the gradient bytes S; CPU as a fraction of one core; machine = "
            "whole-machine busy fraction (includes softirq, i.e. the emulated network's work); "
            "netreduce retx = data packets rank 0 retransmitted / sent"
            "; aggregator dup = packets the aggregator received twice / all it received, "
            "whole run, all ranks (a resend of a packet that was not lost); socket drops = "
            "datagrams the kernel dropped for a full socket buffer, all namespaces"
            "; link s/step = max(wire tx, wire rx) per step / link rate, the time the shaped "
            "link alone needs (share = that / s/step)",
            "", "| model | mode | run | samples/s | s/step | link s/step (share) | wire tx/S | "
            "wire rx/S | rank-0 CPU | aggregator CPU | machine busy | queue drops | netreduce retx "
            "| aggregator dup | socket drops |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if "error" in r:
            continue
        s = r["params"] * 4
        per_step = r["seconds"] / r["steps"]
        link = _link_seconds(r, meta["rate"])
        out.append(
            f"| {r['model']} | {r['mode']} | {r.get('run', 0)} | {r['samples_per_s']:.2f} | "
            f"{per_step:.2f} | "
            + (f"{link:.2f} ({link / per_step:.0%}) | " if link else "- | ")
            + (f"{r['wire_tx_per_step'] / s:.3f} | {r['wire_rx_per_step'] / s:.3f}"
               if "wire_tx_per_step" in r else "- | -")
            + f" | {r.get('cpu_rank0', 0):.0%} | "
            + (f"{r['cpu_switch']:.0%}" if "cpu_switch" in r else "-")
            + f" | {r.get('machine_busy', 0):.0%} | {r.get('queue_drops', '-')} | "
            + (f"{r['nr_retransmits_per_step'] / r['nr_packets_per_step']:.1%}"
               if r.get("nr_packets_per_step") else "-")
            + (f" | {r['switch']['duplicates'] / max(r['switch']['packets_in'], 1):.1%}"
               if "switch" in r else " | -")
            + f" | {r.get('socket_drops', '-')} |")
    timed = [r for r in records if "phase_s" in r and "error" not in r]
    if timed:
        out += ["", "## where rank 0's step goes (seconds per step)", "",
                "forward = model + loss (no communication in any mode); backward = autograd, "
                "during which DDP and the Horovod hooks already all-reduce; update = "
                "optimizer.step(), which for the Horovod API first waits for the all-reduces; "
                "beyond link = s/step - link s/step, the time the step is not moving "
                "gradient bytes on the shaped link", "",
                "| model | mode | run | forward | backward | update | s/step | link s/step | "
                "beyond link |", "|---|---|---|---|---|---|---|---|---|"]
        for r in timed:
            per_step, link, ph = r["seconds"] / r["steps"], _link_seconds(r, meta["rate"]), r["phase_s"]
            out.append(f"| {r['model']} | {r['mode']} | {r.get('run', 0)} | {ph['forward']:.2f} | "
                       f"{ph['backward']:.2f} | {ph['update']:.2f} | {per_step:.2f} | "
                       + (f"{link:.2f} | {per_step - link:.2f} |" if link else "- | - |"))
    errors = [r for r in records if "error" in r]
    if errors:
        out += ["", "Not measured:", ""]
        out += [f"- {r['mode']} {r['model']} N={r['ranks']}: {r['error']}" for r in errors]
    return "\n".join(out) + "\n"


def testbed_plot(meta: Dict, summary: Dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models, modes = meta["models"], meta["modes"]
    colors = {"nr-hvd": "#d62728", "nr-ddp": "#ff7f0e", "nr-hook": "#e377c2",
              "ddp-gloo": "#1f77b4", "hvd-gloo": "#9467bd"}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    width = 0.8 / max(len(modes), 1)
    for k, mode in enumerate(modes):
        xs = [i + (k - (len(modes) - 1) / 2) * width for i in range(len(models))]
        ys = [summary["samples_per_s"][m][mode] or 0 for m in models]
        bars = ax1.bar(xs, ys, width, label=mode, color=colors.get(mode))
        ax1.bar_label(bars, fmt="%.1f", fontsize=7)
    ax1.set_xticks(range(len(models)), models)
    ax1.set_ylabel("samples/s (all ranks)")
    ax1.set_title(f"throughput, N={meta['ranks']}, {meta['rate']}/host, batch {meta['batch']}")
    ax1.legend(fontsize=8)
    pairs = [(nr, b) for nr in modes if nr.startswith("nr-") for b in modes if not b.startswith("nr-")]
    width = 0.8 / max(len(pairs), 1)
    for k, (nr, b) in enumerate(pairs):
        xs = [i + (k - (len(pairs) - 1) / 2) * width for i in range(len(models))]
        ys = [summary["speedup"][m].get(nr, {}).get(b, 0) for m in models]
        bars = ax2.bar(xs, ys, width, label=f"{nr} / {b}", color=colors.get(nr),
                       hatch="//" if b == "hvd-gloo" else None, edgecolor="white")
        ax2.bar_label(bars, fmt="%.2f", fontsize=7)
    n = meta["ranks"]
    ax2.axhline(2 * (n - 1) / n, color="k", ls="--", lw=1,
                label=f"comm-only bound 2(N-1)/N = {2 * (n - 1) / n:.2f}")
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.set_xticks(range(len(models)), models)
    ax2.set_ylabel("speed-up (netreduce / baseline samples/s)")
    ax2.set_title("netreduce speed-up (target: alexnet >= 1.5x)")
    ax2.legend(fontsize=7, loc="upper right")
    ax2.set_ylim(0, max(2.0, ax2.get_ylim()[1] * 1.15))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def testbed_main(args: argparse.Namespace) -> int:
    from netreduce.testbed import Testbed, why_unusable

    reason = why_unusable()
    if reason:
        print(f"train.py --testbed: {reason}", file=sys.stderr)
        return 2
    if len(args.ranks) != 1:
        print("train.py --testbed: one world size per run (--ranks N)", file=sys.stderr)
        return 2
    n = args.ranks[0]
    if args.per_host < 1 or n % args.per_host:
        print(f"train.py --testbed: --per-host {args.per_host} does not divide {n} ranks",
              file=sys.stderr)
        return 2
    t_start = time.monotonic()
    meta = {"date": common.utc_now(), "command": common.command_line(),
            "machine": common.machine_description(), "loadavg_at_start": os.getloadavg(),
            "mode": "testbed", "rate": args.rate, "ranks": n, "models": args.models,
            "modes": args.modes, "batch": args.batch_size, "steps": args.steps,
            "warmup": args.warmup, "threads": args.threads, "repeat": args.repeat,
            "switch_args": args.switch_args, "testbed_name": args.testbed_name,
            "per_host": args.per_host}
    records: List[Dict] = []
    samples: List[float] = []
    done = threading.Event()

    def sample_load() -> None:  # the 1-minute load average every 10 s while running
        while not done.is_set():
            samples.append(os.getloadavg()[0])
            done.wait(10)

    sampler = threading.Thread(target=sample_load, daemon=True)
    sampler.start()
    with Testbed(hosts=n // args.per_host, rate=args.rate, name=args.testbed_name, subnet=args.subnet,
                 replace=True) as tb:
        print("# " + tb.describe().replace("\n", "\n# "), flush=True)
        print(f"{'model':9} {'N':>2} {'mode':9} {'samples/s':>10} {'s/step':>7} {'cpu0':>5} "
              f"{'agg':>5} {'mach':>5} {'tx/S':>6}", flush=True)
        for rep in range(args.repeat):
            for model in args.models:
                for mode in args.modes:
                    if rep and any("error" in r and (r["mode"], r["model"]) == (mode, model)
                                   for r in records):
                        continue
                    r = dict(run_one_testbed(tb, mode, model, n, args), run=rep)
                    records.append(r)
                    if "error" in r:
                        print(f"{model:9} {n:2d} {mode:9} FAILED {r['error']}", flush=True)
                        continue
                    tx = r.get("wire_tx_per_step", 0) / (4 * r["params"])
                    sw = f"{r['cpu_switch']:5.0%}" if "cpu_switch" in r else f"{'-':>5}"
                    print(f"{model:9} {n:2d} {mode:9} {r['samples_per_s']:10.2f} "
                          f"{r['seconds'] / r['steps']:7.2f} {r.get('cpu_rank0', 0):5.0%} {sw} "
                          f"{r.get('machine_busy', 0):5.0%} {tx:6.3f}   ({r['wall_s']:.0f} s"
                          + (f", retx {r['nr_retransmits_per_step'] / r['nr_packets_per_step']:.1%}"
                             if r.get("nr_packets_per_step") else "")
                          + (f", aggregator duplicates {r['switch']['duplicates']} of "
                             f"{r['switch']['packets_in']} in" if "switch" in r else "")
                          + f", socket drops {r.get('socket_drops', '-')})",
                          flush=True)
    done.set()
    meta["loadavg_at_end"] = os.getloadavg()
    meta["loadavg_1min_during"] = [min(samples), max(samples)] if samples else None
    meta["duration_s"] = time.monotonic() - t_start
    summary = testbed_summary(records, args.models, args.modes)
    for model, row in summary["speedup"].items():
        for nr, vs in row.items():
            print(f"# speed-up {model} {nr}: " + ", ".join(f"{v:.2f}x vs {b}" for b, v in vs.items()))
    for path in (args.out, args.json, args.plot):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if args.json:
        common.write_json(args.json, dict(meta, summary=summary), records)
        print(f"wrote {args.json}")
    if args.out:
        with open(args.out, "w") as f:
            f.write(testbed_markdown(meta, records, summary))
        print(f"wrote {args.out}")
    if args.plot:
        testbed_plot(meta, summary, args.plot)
        print(f"wrote {args.plot}")
    return 0 if all("error" not in r for r in records if r["mode"] != "hvd-gloo") else 1
