"""Where each fusion buffer (Horovod API) or DDP bucket waits, step by step: rank 0's
NETREDUCE_TIMELINE read beside the step stamps of benchmarks/overlap_site's probe
(zero_grad, backward start and end, update start and end; the same wall clock).

For every data-plane message of a step (one per fusion group: the ``allreduce``
spans its tensors share) it gives, in ms after backward started: when its last
tensor was submitted (``ready``: the gradient hook or DDP's bucket), when the
transfer started and ended, its bytes and tensors; so ``start - ready`` is what it
waited before (negotiation, the agreement round, the message ahead of it) and
``update - end`` what the step waited after it. Per step: how much of the
transfer ran while backward did (hidden), how much after (exposed), and the link's
idle gaps between messages once the first had started.

    python3 benchmarks/overlap_timeline.py TIMELINE.json PHASES.json
"""
from __future__ import annotations

import json
import statistics
import sys
from typing import Any, Dict, List, Tuple

ROUND_ROW = "(agreement rounds)"  # netreduce/worker/agreement.py's row


def load_events(path: str) -> List[Dict[str, Any]]:
    text = open(path).read().strip()
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"  # a run that did not close its timeline
    return json.loads(text)


def groups(events: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One entry per data-plane message: start, end (µs), bytes, tensor names, and
    when each of its tensors entered the communicator (submitted)."""
    names = {e["tid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    by_tensor: Dict[str, List[Dict[str, Any]]] = {}
    for e in events:
        if e.get("ph") == "X":
            by_tensor.setdefault(names.get(e["tid"], str(e["tid"])), []).append(e)
    messages: Dict[Tuple[float, float], Dict[str, Any]] = {}
    rounds = [{"start": e["ts"], "end": e["ts"] + e["dur"], "bytes": 0, "tensors": [],
               "submitted": [], "round": True}
              for e in by_tensor.pop(ROUND_ROW, []) if e["name"] == "round"]
    for name, spans in by_tensor.items():
        spans.sort(key=lambda e: e["ts"])
        submitted = None
        for e in spans:
            if e["name"] in ("negotiate", "queued") and submitted is None:
                submitted = e["ts"]
            if e["name"] == "allreduce":
                key = (e["ts"], e["dur"])
                m = messages.setdefault(key, {"start": e["ts"], "end": e["ts"] + e["dur"],
                                              "bytes": e.get("args", {}).get("bytes", 0),
                                              "tensors": [], "submitted": []})
                m["tensors"].append(name)
                if submitted is not None:
                    m["submitted"].append(submitted)
                submitted = None
    return sorted(list(messages.values()) + rounds, key=lambda m: m["start"])


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def analyse(timeline_path: str, steps: List[List[float]]) -> Dict[str, Any]:
    """Per-step message table and per-step totals (ms), and their medians."""
    msgs = groups(load_events(timeline_path))
    per_step = []
    for i, (z, b0, b1, u0, u1) in enumerate(steps):
        end = steps[i + 1][0] if i + 1 < len(steps) else u1
        mine = [m for m in msgs if z <= m["start"] < end]
        rows, busy, hidden, gaps, prev, in_rounds = [], 0.0, 0.0, 0.0, None, 0.0
        for m in mine:
            ready = max(m["submitted"]) if m["submitted"] else None
            rows.append({"ready": None if ready is None else round((ready - b0) / 1e3, 1),
                         "start": round((m["start"] - b0) / 1e3, 1),
                         "end": round((m["end"] - b0) / 1e3, 1),
                         "MB": round(m["bytes"] / 1e6, 2), "tensors": len(m["tensors"]),
                         "round": bool(m.get("round"))})
            if m.get("round"):
                in_rounds += m["end"] - m["start"]
            else:
                busy += m["end"] - m["start"]
                hidden += _overlap(m["start"], m["end"], b0, b1)
            if prev is not None:
                gaps += max(0.0, m["start"] - prev)
            prev = m["end"]
        per_step.append({
            "backward_ms": round((b1 - b0) / 1e3, 1), "wait_ms": round((u0 - b1) / 1e3, 1),
            "messages": rows, "transfer_ms": round(busy / 1e3, 1),
            "hidden_ms": round(hidden / 1e3, 1), "exposed_ms": round((busy - hidden) / 1e3, 1),
            "gaps_ms": round(gaps / 1e3, 1), "rounds": sum(1 for r in rows if r["round"]),
            "rounds_ms": round(in_rounds / 1e3, 1),
            "first_start_ms": rows[0]["start"] if rows else None,
            "last_end_after_backward_ms": round((mine[-1]["end"] - b1) / 1e3, 1) if mine else None})
    keys = ("backward_ms", "wait_ms", "transfer_ms", "hidden_ms", "exposed_ms", "gaps_ms",
            "rounds", "rounds_ms", "first_start_ms", "last_end_after_backward_ms")
    medians = {k: round(statistics.median([s[k] for s in per_step if s[k] is not None]), 1)
               for k in keys if any(s[k] is not None for s in per_step)}
    medians["messages"] = statistics.median([len(s["messages"]) - s["rounds"] for s in per_step]) \
        if per_step else 0
    typical = min(per_step, key=lambda s: abs(s["wait_ms"] - medians.get("wait_ms", 0))) \
        if per_step else None
    return {"median": medians, "typical_step": typical, "steps": per_step}


def describe(result: Dict[str, Any], indent: str = "") -> str:
    m = result["median"]
    out = [indent + "per step (medians, ms): backward %s, wait after it %s; transfer %s, of which "
           "hidden %s, exposed %s; %s agreement round(s) taking %s; no message under way %s; "
           "first message starts %s after backward starts, last ends %s after it ends; "
           "%s data messages" % (
               m.get("backward_ms"), m.get("wait_ms"), m.get("transfer_ms"), m.get("hidden_ms"),
               m.get("exposed_ms"), m.get("rounds"), m.get("rounds_ms"), m.get("gaps_ms"),
               m.get("first_start_ms"), m.get("last_end_after_backward_ms"), m.get("messages"))]
    t = result.get("typical_step")
    if t:
        out.append(indent + "a typical step (ms after backward start; backward ends at %s, "
                   "the update starts at %s):" % (t["backward_ms"], t["backward_ms"] + t["wait_ms"]))
        for row in t["messages"]:
            if row["round"]:
                out.append(indent + "  agreement round                        %7.1f .. %7.1f" % (
                    row["start"], row["end"]))
                continue
            out.append(indent + "  %6.2f MB in %3d tensor(s): ready %7s, sent %7.1f .. %7.1f" % (
                row["MB"], row["tensors"], row["ready"], row["start"], row["end"]))
    return "\n".join(out)


def main(argv: List[str]) -> int:
    with open(argv[1]) as f:
        steps = json.load(f)
    result = analyse(argv[0], steps)
    print(describe(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
