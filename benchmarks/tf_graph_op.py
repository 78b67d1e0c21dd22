"""Cost per call of netreduce.tensorflow's asynchronous graph op against the
tf.numpy_function node it replaced, in the same run (N ranks under netreduce-run).

    PYTHONPATH=. python benchmarks/tf_graph_op.py                    # N=2, the record
    PYTHONPATH=. python benchmarks/tf_graph_op.py --sizes 1024 --rounds 2 --calls 50 \
        --out ''                                                     # smoke run

Each variant is a tf.function holding one all-reduce (Sum, float32) of the given size,
called back to back; the variants alternate round by round so that they share the
machine's conditions: ``op`` (the graph op; its bridge thread runs a ready step itself,
as a waiting eager caller does), ``op-nohelp`` (the graph op, every step left to the
core's executor thread), ``numpy_function``, ``eager`` (no graph). Per call: wall time and the
CPU time of the whole rank process (every thread: TensorFlow's, the bridge, netreduce's
negotiation and executor), both on rank 0. The numpy_function variant is the previous
adapter's graph path: one stateful tf.numpy_function whose body submits to the core
and waits (buffers.allreduce(...).wait()), the inter-op thread blocked meanwhile.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "results", "tf_graph_op.json")
VARIANTS = ["op", "op-nohelp", "numpy_function", "eager"]


def worker(args: argparse.Namespace) -> None:
    import numpy as np
    import tensorflow as tf

    import netreduce.tensorflow as hvd
    from netreduce.tensorflow import buffers

    hvd.init()

    def numpy_node(x, name):
        def body(a):
            return buffers.allreduce([a], name, hvd.Sum).wait()
        out = tf.numpy_function(body, [x], [x.dtype], stateful=True)
        out = out[0] if isinstance(out, (list, tuple)) else out
        out.set_shape(x.shape)
        return out

    results: Dict[str, Dict[str, List[float]]] = {}
    for size in args.sizes:
        x = tf.ones([size // 4], tf.float32)
        fns = {
            "op": tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, name=f"bench.op.{size}")),
            "op-nohelp": tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, name=f"bench.op2.{size}")),
            "numpy_function": tf.function(lambda t: numpy_node(t, f"bench.np.{size}")),
            "eager": lambda t: hvd.allreduce(t, op=hvd.Sum, name=f"bench.eager.{size}"),
        }
        for fn in fns.values():  # trace, build, negotiate and cache every name first
            for _ in range(5):
                assert np.allclose(fn(x).numpy()[:1], hvd.size())
        per = {v: {"wall_us": [], "cpu_us": []} for v in VARIANTS}
        for _ in range(args.rounds):
            for variant in VARIANTS:
                fn = fns[variant]
                from netreduce.tensorflow import op_bridge
                op_bridge.HELP = variant != "op-nohelp"
                hvd.barrier()
                c0, t0 = time.process_time(), time.perf_counter()
                for _ in range(args.calls):
                    y = fn(x)
                y.numpy()
                t1, c1 = time.perf_counter(), time.process_time()
                per[variant]["wall_us"].append((t1 - t0) / args.calls * 1e6)
                per[variant]["cpu_us"].append((c1 - c0) / args.calls * 1e6)
        results[str(size)] = per
    if hvd.rank() == 0:
        print("RESULT " + json.dumps(results), flush=True)
    hvd.barrier()


def _summary(values: List[float]) -> Dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def markdown(meta: Dict, results: Dict) -> str:
    variants = [v for v in VARIANTS if v in next(iter(results.values()))]
    lines = [f"`{meta['command']}` — {meta['date']}, N = {meta['ranks']}, {meta['rounds']} "
             f"rounds x {meta['calls']} calls per variant, TensorFlow {meta['tensorflow']}; "
             f"load average {meta['loadavg_at_start'][0]:.2f} at start, "
             f"{meta['loadavg_at_end'][0]:.2f} at end (2 shared cores). Median per call over "
             "the rounds (min–max), rank 0; CPU = the whole rank process, every thread.", "",
             "| bytes | variant | wall µs/call | CPU µs/call | wall / numpy_function | "
             "CPU / numpy_function |", "|---:|---|---:|---:|---:|---:|"]
    for size, per in results.items():
        s = {v: {k: _summary(per[v][k]) for k in per[v]} for v in variants}
        base = s["numpy_function"]
        for v in variants:
            w, c = s[v]["wall_us"], s[v]["cpu_us"]
            lines.append(f"| {size} | {v} | {w['median']:.0f} ({w['min']:.0f}–{w['max']:.0f}) | "
                         f"{c['median']:.0f} ({c['min']:.0f}–{c['max']:.0f}) | "
                         f"{w['median'] / base['wall_us']['median']:.2f} | "
                         f"{c['median'] / base['cpu_us']['median']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--sizes", type=int, nargs="+", default=[4, 4096, 262144, 4194304],
                   help="bytes per all-reduce (float32)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=200, help="calls per round and variant")
    p.add_argument("--out", default=OUT, help="raw JSON record ('' = none)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    sys.path.insert(0, HERE)
    import common
    import tensorflow as tf
    meta = {"date": common.utc_now(), "command": common.command_line(),
            "machine": common.machine_description(), "loadavg_at_start": os.getloadavg(),
            "ranks": args.ranks, "rounds": args.rounds, "calls": args.calls,
            "sizes": args.sizes, "tensorflow": tf.__version__}
    cmd = [sys.executable, "-m", "netreduce.launcher", "-np", str(args.ranks), "--",
           sys.executable, os.path.abspath(__file__), "--worker", "--rounds", str(args.rounds),
           "--calls", str(args.calls), "--sizes", *map(str, args.sizes)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=3600)
    found = [line.split("RESULT ", 1)[1] for line in proc.stdout.splitlines() if "RESULT " in line]
    meta["loadavg_at_end"] = os.getloadavg()
    if proc.returncode != 0 or not found:
        print(proc.stdout[-5000:], file=sys.stderr)
        return 1
    results = json.loads(found[0])
    print(markdown(meta, results))
    if args.out:
        common.write_json(args.out, meta, [{"bytes": int(k), **v} for k, v in results.items()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
