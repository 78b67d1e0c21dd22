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

With every rank's timeline and stamps (overlap_step.py --timeline-ranks), ``tail``
says where the wait after backward went: the wire, the link idle because a group
was not yet submitted on every rank, not yet agreed by a round, or agreed and not
yet handed to the engine, and the landing after the last message:

    python3 benchmarks/overlap_timeline.py tail TL0 PHASES0 TL1 PHASES1 ...
    python3 benchmarks/overlap_timeline.py kept FOLDER [OUT.json]   # every run --keep kept
"""
from __future__ import annotations

import functools
import json
import statistics
import sys
from typing import Any, Dict, List, Optional, Tuple

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
        submitted = agreed = None
        for e in spans:
            if e["name"] in ("negotiate", "queued") and submitted is None:
                submitted = e["ts"]
            if e["name"] == "copy_in" and agreed is None:
                agreed = e["ts"]  # the executor took the group up (a round agreed it)
            if e["name"] == "allreduce":
                key = (e["ts"], e["dur"])
                m = messages.setdefault(key, {"start": e["ts"], "end": e["ts"] + e["dur"],
                                              "bytes": e.get("args", {}).get("bytes", 0),
                                              "tensors": [], "submitted": [], "agreed": None})
                m["tensors"].append(name)
                if submitted is not None:
                    m["submitted"].append(submitted)
                if agreed is not None:
                    m["agreed"] = agreed if m["agreed"] is None else min(m["agreed"], agreed)
                submitted = agreed = None
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


def submissions(events: List[Dict[str, Any]]) -> Dict[str, List[float]]:
    """Tensor name -> when it was submitted on this rank (µs, sorted): the start of
    each of its ``negotiate`` or ``queued`` spans."""
    names = {e["tid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    out: Dict[str, List[float]] = {}
    for e in events:
        if e.get("ph") == "X" and e["name"] in ("negotiate", "queued"):
            out.setdefault(names.get(e["tid"], str(e["tid"])), []).append(e["ts"])
    for times in out.values():
        times.sort()
    return out


def _rel_ms(origin: float, v: Optional[float]) -> Optional[float]:
    return None if v is None else round((v - origin) / 1e3, 1)


def _first_in(times: List[float], lo: float, hi: float) -> Optional[float]:
    return next((t for t in times if lo <= t < hi), None)


TAIL_PARTS = ("wire", "not_ready", "agreement", "submit", "landing")


def _classify(lo: float, hi: float, data: List[Dict[str, Any]]) -> Dict[str, float]:
    """Where [lo, hi] went (µs), from rank 0's data messages in start order: on the
    wire (a message of rank 0 under way), or the link idle before the next message
    because its group was not yet submitted on every rank (not_ready), was on every
    rank but not yet agreed by a round (agreement), was agreed but not yet on the
    wire (submit: the copy in, the hand-over, the engine's queue); after the last
    message, until hi: landing (copy out, completion, the user's wait waking)."""
    out = dict.fromkeys(TAIL_PARTS, 0.0)
    cur = lo
    for m in data:
        if m["end"] <= cur:
            continue
        if m["start"] >= hi:
            break
        if m["start"] > cur:
            a, b = cur, m["start"]
            ready = m.get("ready_all")
            ready = a if ready is None else ready
            agreed = m.get("agreed") if m.get("agreed") is not None else ready
            out["not_ready"] += _overlap(a, b, float("-inf"), ready)
            out["agreement"] += _overlap(a, b, ready, max(ready, agreed))
            out["submit"] += _overlap(a, b, max(ready, agreed), float("inf"))
        out["wire"] += _overlap(m["start"], m["end"], max(cur, lo), hi)
        cur = max(cur, m["end"])
        if cur >= hi:
            break
    out["landing"] = max(0.0, hi - cur)
    return out


def tail(timeline_paths: List[Optional[str]], rank_steps: List[List[List[float]]]
         ) -> Dict[str, Any]:
    """The tail of every step, from every rank's timeline and step stamps (index r:
    rank r; rank r's step matched to rank 0's by the nearest update start; a rank
    without its files is None / []). Per step, in ms:

    * the ranks' backward ends after rank 0's (``skew``: rank 0's wait can be no
      shorter), and when the last gradient was submitted on every rank;
    * the wait after rank 0's backward (b1 -> update) split by ``_classify`` into
      wire, not_ready, agreement, submit, landing; the same split of backward itself
      (b0 -> b1: the link idle while backward ran);
    * ``ideal_end``: when the last message would have ended had each of rank 0's
      messages gone on the wire as soon as its group was submitted on every rank
      and the message ahead was done, with the durations measured: the wait that
      neither the rounds nor the hand-over caused;
    * per message: ready on rank 0, ready on every rank, agreed, on the wire, done.
    """
    msgs = [m for m in groups(load_events(timeline_paths[0])) if not m.get("round")]
    subs = [submissions(load_events(p)) if p else None for p in timeline_paths]
    steps0 = rank_steps[0]
    per_step = []
    for i, (z, b0, b1, u0, u1) in enumerate(steps0):
        end = steps0[i + 1][0] if i + 1 < len(steps0) else u1
        data = sorted((dict(m) for m in msgs if z <= m["start"] < end), key=lambda m: m["start"])
        windows, ends = [], []
        for r, steps in enumerate(rank_steps):
            if not steps:
                windows.append(None)
                continue
            # the same step on rank r: the one whose update starts nearest rank 0's
            # (the ranks leave a step's wait together: its last message ends for all)
            j = min(range(len(steps)), key=lambda k, s=steps: abs(s[k][3] - u0))
            ends.append(steps[j][2])
            hi = steps[j + 1][0] if j + 1 < len(steps) else steps[j][4]
            windows.append(None if subs[r] is None else (steps[j][0], hi))
        for m in data:
            ready_all = None
            for r, win in enumerate(windows):
                if win is None:
                    continue
                for name in m["tensors"]:
                    t = _first_in(subs[r].get(name, []), *win)
                    if t is not None:
                        ready_all = t if ready_all is None else max(ready_all, t)
            m["ready_all"] = ready_all
        finish, ideal = None, None
        for m in data:
            ready = m["ready_all"] if m["ready_all"] is not None else m["start"]
            begin = ready if finish is None else max(finish, ready)
            finish = begin + (m["end"] - m["start"])
            ideal = finish
        after = _classify(b1, u0, data)
        during = _classify(b0, b1, data)
        during.pop("landing")
        left = sum(m["bytes"] * _overlap(m["start"], m["end"], b1, float("inf"))
                   / max(m["end"] - m["start"], 1e-9) for m in data)
        ms = functools.partial(_rel_ms, b0)
        per_step.append({
            "backward_ms": round((b1 - b0) / 1e3, 1), "wait_ms": round((u0 - b1) / 1e3, 1),
            "skew_ms": round((max(ends) - b1) / 1e3, 1),
            "last_ready_all_ms": ms(max((m["ready_all"] for m in data
                                        if m["ready_all"] is not None), default=None)),
            "last_end_ms": ms(data[-1]["end"]) if data else None,
            "ideal_end_ms": ms(ideal),
            "MB_after_backward": round(left / 1e6, 2),
            # the link idle while a group was on every rank (rounds, hand-over), and
            # how much later the last message ended than the ideal schedule's
            "idle_ready_ms": round(sum(p[k] for p in (after, during) for k in ("agreement", "submit"))
                                   / 1e3, 1),
            "late_ms": None if ideal is None else round((data[-1]["end"] - ideal) / 1e3, 1),
            "after": {k: round(v / 1e3, 1) for k, v in after.items()},
            "during": {k: round(v / 1e3, 1) for k, v in during.items()},
            "messages": [{"MB": round(m["bytes"] / 1e6, 2), "tensors": len(m["tensors"]),
                          "ready0": ms(max(m["submitted"])) if m["submitted"] else None,
                          "ready_all": ms(m["ready_all"]), "agreed": ms(m["agreed"]),
                          "start": ms(m["start"]), "end": ms(m["end"])} for m in data]})
    med: Dict[str, Any] = {}
    for key in ("backward_ms", "wait_ms", "skew_ms", "last_ready_all_ms", "last_end_ms",
                "ideal_end_ms", "MB_after_backward", "idle_ready_ms", "late_ms"):
        vals = [s[key] for s in per_step if s[key] is not None]
        if vals:
            med[key] = round(statistics.median(vals), 1)
    for part in ("after", "during"):
        med[part] = {k: round(statistics.median([s[part][k] for s in per_step]), 1)
                     for k in (per_step[0][part] if per_step else {})}
    typical = min(per_step, key=lambda s: abs(s["wait_ms"] - med.get("wait_ms", 0))) \
        if per_step else None
    return {"median": med, "typical_step": typical, "steps": per_step}


def describe_tail(result: Dict[str, Any], indent: str = "") -> str:
    m = result["median"]
    a, d = m.get("after", {}), m.get("during", {})
    out = [indent + "tail (medians, ms): backward %s, wait after it %s = wire %s + link idle "
           "(a group not yet submitted on every rank %s, agreement %s, hand-over %s) + "
           "landing %s; the ranks' backward ends %s after rank 0's; %s MB on the wire after "
           "backward; the last message ends at %s, %s had each gone once ready everywhere"
           % (m.get("backward_ms"), m.get("wait_ms"), a.get("wire"), a.get("not_ready"),
              a.get("agreement"), a.get("submit"), a.get("landing"), m.get("skew_ms"),
              m.get("MB_after_backward"), m.get("last_end_ms"), m.get("ideal_end_ms")),
           indent + "during backward (ms): wire %s, link idle: nothing ready everywhere %s, "
           "agreement %s, hand-over %s" % (d.get("wire"), d.get("not_ready"),
                                           d.get("agreement"), d.get("submit"))]
    t = result.get("typical_step")
    if t:
        out.append(indent + "a typical step (ms after rank 0's backward start; it ends at %s, "
                   "the update starts at %s):" % (t["backward_ms"],
                                                  round(t["backward_ms"] + t["wait_ms"], 1)))
        out.append(indent + "      MB  tensors  ready@0  ready@all   agreed    start      end")
        for row in t["messages"]:
            out.append(indent + "  %6.2f  %7d  %7s  %9s  %7s  %7.1f  %7.1f" % (
                row["MB"], row["tensors"], row["ready0"], row["ready_all"], row["agreed"],
                row["start"], row["end"]))
    return "\n".join(out)


def kept(folder: str) -> Dict[str, Any]:
    """``tail`` of every run overlap_step.py --timeline-ranks --keep FOLDER kept
    (LABEL_UTC.rank{r}.{phases,timeline}.json), by LABEL_UTC: the medians of its
    steps. The last 30 steps of each rank (the benchmark's --iters 3
    --batches-per-iter 10)."""
    import glob
    import os
    out = {}
    for p in sorted(glob.glob(os.path.join(folder, "*.rank0.timeline.json"))):
        run = os.path.basename(p)[:-len(".rank0.timeline.json")]
        paths, steps = [], []
        for r in range(64):
            tl, ph = (os.path.join(folder, f"{run}.rank{r}.{k}.json") for k in ("timeline", "phases"))
            if not os.path.exists(ph):
                break
            paths.append(tl if os.path.exists(tl) else None)
            with open(ph) as f:
                steps.append(json.load(f)[-30:])
        out[run] = tail(paths, steps)["median"]
    return out


def main(argv: List[str]) -> int:
    if argv and argv[0] == "kept":  # kept FOLDER [OUT.json]
        result = kept(argv[1])
        for run, med in result.items():
            print(run, json.dumps(med))
        if len(argv) > 2:
            with open(argv[2], "w") as f:
                json.dump({"command": "python3 benchmarks/overlap_timeline.py " + " ".join(argv),
                           "runs": result}, f, indent=1)
        return 0
    if argv and argv[0] == "tail":  # tail TIMELINE0 PHASES0 TIMELINE1 PHASES1 ...
        paths, steps = argv[1::2], []
        for p in argv[2::2]:
            with open(p) as f:
                steps.append(json.load(f))
        print(describe_tail(tail(paths, steps)))
        return 0
    with open(argv[1]) as f:
        steps = json.load(f)
    result = analyse(argv[0], steps)
    print(describe(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
