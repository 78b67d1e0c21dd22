"""Per step of rank 0: the forward's broadcasts (DDP's buffer sync) and the tail
between the last transfer's end and backward's return (DDP) / the update (hvd).

    python3 benchmarks/overlap_step.py torch --runs 3 --modes nr-hvd,nr-ddp --warmup 5 \
        --iters 2 --batches-per-iter 10 --timeline --keep DIR
    python3 benchmarks/results/issue33/ddp_forward_sync.py DIR   # (files may be .gz)

Medians over a run's timed steps, ms: fwd (zero_grad to backward), bcast (first to
last end of the forward's torch.pg*.broadcast.* spans: DDP's buffer sync), bwd, wait
(backward's return to the update), last_submit (the last gradient handed to the
communicator, after backward's start), last_end (the last data message's end), tail
(the update's start minus last_end)."""
import glob
import gzip
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import overlap_timeline as ot  # noqa: E402

def spans(events):
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    by = {}
    for e in events:
        if e.get("ph") == "X":
            by.setdefault(names.get(e["tid"], str(e["tid"])), []).append(e)
    return by

def _read(path):
    return (gzip.open(path, "rt") if path.endswith(".gz") else open(path)).read()


def analyse(tl, ph):
    text = _read(tl).strip()
    ev = json.loads(text if text.endswith("]") else text.rstrip(",") + "]")
    steps = json.loads(_read(ph))
    by = spans(ev)
    msgs = [m for m in ot.groups(ev) if not m.get("round")]
    out = []
    for z, b0, b1, u0, _ in steps:
        fwd = []
        for name, ss in by.items():
            if ".broadcast." not in name:
                continue
            for e in ss:
                if z <= e["ts"] < b0:
                    fwd.append((e["ts"], e["ts"] + e["dur"]))
        bc = (max(e for _, e in fwd) - min(s for s, _ in fwd)) / 1e3 if fwd else 0.0
        mine = [m for m in msgs if b0 <= m["end"] <= u0 + 1]
        last_end = max((m["end"] for m in mine), default=None)
        last_sub = max((max(m["submitted"]) for m in mine if m["submitted"]), default=None)
        out.append({"fwd_ms": (b0 - z) / 1e3, "bcast_ms": bc, "bwd_ms": (b1 - b0) / 1e3,
                    "wait_ms": (u0 - b1) / 1e3,
                    "last_submit_ms": None if last_sub is None else (last_sub - b0) / 1e3,
                    "last_end_ms": None if last_end is None else (last_end - b0) / 1e3,
                    "tail_ms": None if last_end is None else (u0 - last_end) / 1e3})
    med = {k: round(statistics.median([s[k] for s in out if s[k] is not None]), 1) for k in out[0]}
    return med

for tl in sorted(glob.glob(os.path.join(sys.argv[1], "*.timeline.json*"))):
    ph = tl.replace(".timeline.json", ".phases.json")
    if os.path.exists(ph):
        print(os.path.basename(tl), analyse(tl, ph))
