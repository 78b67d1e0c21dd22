"""Training throughput (samples/s) of data-parallel PyTorch on netreduce and its peers.

    python benchmarks/train.py --framework torch                 # everything, one run
    python benchmarks/train.py --framework torch --models alexnet --ranks 2 \
        --modes nr-hvd,ddp-gloo --steps 5
    PYTHONPATH=. python benchmarks/train.py --framework mxnet --testbed   # benchmarks/train_mxnet.py
    PYTHONPATH=. python benchmarks/train.py --framework tensorflow --testbed  # train_tensorflow.py

Modes, each started with its own launcher on this host:
  nr-hvd    netreduce.torch Horovod API: DistributedOptimizer      (netreduce-run)
  nr-ddp    DDP on the "netreduce" torch.distributed backend      (netreduce-run)
  nr-hook   DDP on gloo with netreduce.torch.allreduce_hook       (netreduce-run)
  ddp-gloo  DDP on torch's gloo backend                            (torchrun)
  hvd-gloo  Horovod 0.28.1 built with Gloo (benchmarks/setup_peers.sh) (horovodrun --gloo)

Models (plain torch.nn, torchvision's layouts; torchvision itself does not install
beside torch 2.13): ResNet-18 (11.7 M parameters, compute-bound) and AlexNet
(61.1 M parameters, 95 % of them in the fully connected layers: communication-bound).
Synthetic data: one fixed random batch per rank, 64x64 images, 1000 classes.
Every mode runs the same model, batch, optimizer (SGD, momentum 0.9) and steps; the
timed window starts after warm-up steps and a barrier; samples/s = N * batch * steps /
rank 0's wall time. Results go to stdout and, as Markdown, to --out.

Testbed (issue 5, root): the same ranks, one per emulated host of netreduce.testbed
(network namespaces on a bridge, every host link shaped to --rate each way, the
aggregator's link N x rate; docs/testbed.md), every mode in one run:

    PYTHONPATH=. python benchmarks/train.py --testbed          # AlexNet + ResNet-18, N=4
    PYTHONPATH=. python benchmarks/train.py --testbed --models alexnet --modes nr-hvd \
        --steps 1 --warmup 0 --out '' --json '' --plot ''     # smoke run

Ranks are started directly in their namespaces (no launcher), as benchmarks/allreduce.py
--testbed does (benchmarks/train_testbed.py; one rank is benchmarks/train_rank.py): netreduce modes get NETREDUCE_SWITCH (a netreduce-switch in the
aggregator namespace) and NETREDUCE_RANK/SIZE; DDP modes MASTER_ADDR = host 0's testbed
address and RANK/WORLD_SIZE; Horovod the Gloo rendezvous server of this process (on
the bridge address) and HOROVOD_RANK/SIZE/..., one "host" per namespace. Rank 0 also
reads its link's byte counters (wire bytes per step each way), its own and the
aggregator's CPU time and the machine's busy fraction over the timed window. Writes
--out (Markdown), --json and --plot (PNG: samples/s and speed-up bars).

--rate (default 300mbit per host, each way): AlexNet's 244 MB of gradients then need
~6.6 s of link time per step with in-network aggregation and ~9.8 s in a ring against
well under 1 s of compute (batch 8), so communication dominates, and the whole run (both
models, four modes, 1 warm-up + 3 timed steps) takes ~6-7 minutes. Much faster links
make the 2-core machine, not the links, the bottleneck: netreduce's aggregator used
~1/3 of a core per 100 MB/s of aggregate traffic in benchmarks/results/testbed.md, so
at 1gbit per host it alone would need ~1.7 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import common  # noqa: E402
import train_rank  # noqa: E402
import train_testbed  # noqa: E402

MODES = ["nr-hvd", "nr-ddp", "ddp-gloo", "hvd-gloo"]
ALL_MODES = MODES + ["nr-hook"]


# --- on this host ------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(mode: str, n: int, me: List[str]) -> Optional[List[str]]:
    """``me`` (one rank's command line) under ``mode``'s own launcher, n ranks."""
    if mode.startswith("nr-"):
        return [sys.executable, "-m", "netreduce.launcher", "-np", str(n), "--", *me]
    if mode == "ddp-gloo":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
                "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), *me[1:]]
    if mode == "hvd-gloo":
        horovodrun = shutil.which("horovodrun")
        if horovodrun is None:
            return None
        return [horovodrun, "-np", str(n), "-H", f"localhost:{n}", "--gloo", *me]
    raise ValueError(mode)


def run_one(mode: str, model: str, n: int, args: argparse.Namespace) -> Dict:
    record = {"mode": mode, "model": model, "ranks": n}
    if mode == "hvd-gloo":
        missing = common.horovod_missing()
        if missing:
            return dict(record, error=missing)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    cmd = _command(mode, n, train_rank.argv(mode, model, args))
    try:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return dict(record, error=f"timed out after {args.timeout} s")
    for line in proc.stdout.splitlines():
        if "RESULT " in line:
            return dict(record, **json.loads(line.split("RESULT ", 1)[1]))
    tail = " | ".join(proc.stdout.strip().splitlines()[-3:])
    return dict(record, error=f"exit {proc.returncode}: {tail[-300:]}")


def markdown(records: List[Dict], args: argparse.Namespace, started: str) -> str:
    try:
        machine = common.machine_description()
    except Exception:  # a missing tool must not lose the run's figures
        machine = {"cores": os.cpu_count()}
    lines = [
        "# Training throughput: netreduce vs DDP-gloo vs Horovod-gloo (PyTorch)", "",
        f"Measured {started} UTC with", "",
        "    " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]), "",
        f"Machine: {machine.get('cpu', '?')}, {machine.get('cores')} cores, "
        f"{machine.get('memory_gib', '?')} GiB; every rank on this one host (loopback), "
        f"{args.threads} torch thread(s) per rank. Batch {args.batch_size} per rank, "
        f"64x64 synthetic images, SGD momentum 0.9, {args.warmup} warm-up + {args.steps} "
        f"timed steps. samples/s over all ranks (higher is better): median of {args.repeat} "
        "runs (min–max); the runs of all modes are interleaved so that load from other "
        "processes on the host falls on every mode alike.", "",
        "| model | N | " + " | ".join(args.modes) + " |",
        "|---|---|" + "---|" * len(args.modes),
    ]
    for model in args.models:
        for n in args.ranks:
            cells = []
            for mode in args.modes:
                values = sorted(r["samples_per_s"] for r in records
                                if (r["mode"], r["model"], r["ranks"]) == (mode, model, n)
                                and "error" not in r)
                if not values:
                    cells.append("—")
                elif len(values) == 1:
                    cells.append(f"{values[0]:.1f}")
                else:
                    median = values[len(values) // 2] if len(values) % 2 else \
                        (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2
                    cells.append(f"**{median:.1f}** ({values[0]:.1f}–{values[-1]:.1f})")
            lines.append(f"| {model} | {n} | " + " | ".join(cells) + " |")
    errors = [r for r in records if "error" in r]
    if errors:
        lines += ["", "Not measured:", ""]
        lines += [f"- {r['mode']} {r['model']} N={r['ranks']}: {r['error']}" for r in errors]
    lines += ["", "Raw records (JSON lines):", "", "```"]
    lines += [json.dumps(r) for r in records] + ["```", ""]
    return "\n".join(lines)


def main() -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--framework", default="torch")
    known, rest = pre.parse_known_args()
    if known.framework == "mxnet":  # its model and loop, workers in MXNet's own venv
        import train_mxnet
        return train_mxnet.main(rest)
    if known.framework == "tensorflow":  # Keras model and loop: benchmarks/train_tensorflow.py
        import train_tensorflow
        return train_tensorflow.main(rest)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--framework", default="torch", choices=["torch", "mxnet"],
                   help="torch (this file) or mxnet (benchmarks/train_mxnet.py, --testbed)")
    p.add_argument("--models", default="resnet18,alexnet")
    p.add_argument("--ranks", default="2,4", help="comma-separated world sizes")
    p.add_argument("--modes", default=",".join(MODES), help=f"any of {','.join(ALL_MODES)}")
    p.add_argument("--batch-size", type=int, default=None, help="per rank (default 16; testbed 8)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10; testbed 3)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 3; testbed 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--timeout", type=int, default=600, help="seconds per configuration")
    p.add_argument("--repeat", type=int, default=None,
                   help="runs of every configuration (median reported), interleaved "
                        "(default 3; testbed 1)")
    p.add_argument("--out", default=None,
                   help="Markdown report ('' = none; default results/train.md, testbed "
                        "results/train_testbed.md)")
    p.add_argument("--testbed", action="store_true",
                   help="one rank per emulated host of netreduce.testbed (root), N=4 by default")
    p.add_argument("--rate", default="300mbit",
                   help="testbed: each host link's rate each way, tc syntax (default 300mbit)")
    p.add_argument("--per-host", type=int, default=1,
                   help="testbed: ranks per emulated host (netreduce then runs hierarchical)")
    p.add_argument("--testbed-name", default="nrtrain", help="testbed name prefix (default nrtrain)")
    p.add_argument("--subnet", default="10.80.0.0/24", help="testbed subnet (default 10.80.0.0/24)")
    p.add_argument("--switch-args", default="", help="testbed: extra netreduce-switch options")
    p.add_argument("--json", default=None,
                   help="testbed: records + metadata as JSON ('' = none; default "
                        "results/train_testbed.json)")
    p.add_argument("--plot", default=None,
                   help="testbed: PNG (samples/s, speed-up bars) ('' = none; default "
                        "results/train_testbed.png)")
    args = p.parse_args()
    tb = args.testbed
    for name, loop, testbed in (("batch_size", 16, 8), ("steps", 10, 3), ("warmup", 3, 1),
                                ("repeat", 3, 1)):
        if getattr(args, name) is None:
            setattr(args, name, testbed if tb else loop)
    if args.out is None:
        args.out = train_testbed.TESTBED_OUT + ".md" if tb else \
            os.path.join(HERE, "results", "train.md")
    args.json = train_testbed.TESTBED_OUT + ".json" if args.json is None and tb else args.json
    args.plot = train_testbed.TESTBED_OUT + ".png" if args.plot is None and tb else args.plot
    if tb and args.ranks == "2,4":
        args.ranks = "4"
    args.models = args.models.split(",")
    args.ranks = [int(n) for n in args.ranks.split(",")]
    args.modes = args.modes.split(",")
    for mode in args.modes:
        if mode not in ALL_MODES:
            p.error(f"unknown mode {mode!r}")
    if tb:
        return train_testbed.testbed_main(args)
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    records = []
    print(f"{'model':9} {'N':>2} {'mode':9} {'samples/s':>10}", flush=True)
    for rep in range(args.repeat):
        for model in args.models:
            for n in args.ranks:
                for mode in args.modes:
                    if rep and any("error" in r and (r["mode"], r["model"], r["ranks"]) ==
                                   (mode, model, n) for r in records):
                        continue  # failed once (e.g. Horovod missing): do not retry
                    r = dict(run_one(mode, model, n, args), run=rep)
                    records.append(r)
                    value = f"{r['samples_per_s']:10.1f}" if "error" not in r else r["error"]
                    print(f"{model:9} {n:2d} {mode:9} {value}", flush=True)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(markdown(records, args, started))
        print(f"wrote {args.out}")
    return 0 if all("error" not in r for r in records if r["mode"] != "hvd-gloo") else 1


if __name__ == "__main__":
    sys.exit(main())
