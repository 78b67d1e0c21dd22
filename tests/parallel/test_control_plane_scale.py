"""The coordinator at scale, against a real netreduce-switch on loopback: 200
simulated ranks (one control connection each, the rank side of the protocol on one
asyncio loop, no data plane) join one job and negotiate a few steps. The daemon
serves them all from its event loop: its thread count does not grow with the
ranks, every rank reads the same log, and a rank that dies fails the others'
long-polls with an error naming it. (1,000 ranks: benchmarks/control_plane.py.)"""
from __future__ import annotations

import asyncio
import json
import uuid

from netreduce.switch import spawn
from netreduce.testbed import proc_stat
from tests.raw_wire import greet_async

RANKS = 200


async def _call(reader, writer, msg):
    writer.write((json.dumps(msg) + "\n").encode())
    return json.loads(await reader.readline())


def _req(step):
    return {"name": f"g{step}", "kind": "allreduce", "dtype": "float32", "shape": [8], "op": "sum"}


async def _job(address, job, steps, pid, die=None):
    joined = asyncio.Event()
    threads_while_parked = []

    async def rank(r):
        reader, writer = await asyncio.open_connection(*address)
        await greet_async(reader, writer)
        hello = await _call(reader, writer, {"cmd": "negotiate_hello", "role": "all", "job": job,
                                             "rank": r, "size": RANKS, "timeout": 60})
        assert hello["ok"], hello
        if r == 0:
            joined.set()
        seq, seen = hello["seq"], []
        for step in range(steps):
            if die is not None and r == die and step == 1:
                writer.close()  # killed: its connection closes, nothing else
                return None
            # the long-poll and the submission of the same step, in flight together
            # on one connection (ids), as the rank-side client sends them
            poll = {"cmd": "negotiate", "id": 2 * step, "reqs": [_req(step)], "ack": seq,
                    "wait_ms": 1000, "stall_s": 60}
            writer.write((json.dumps(poll) + "\n").encode())
            while True:
                reply = json.loads(await reader.readline())
                assert reply["ok"], reply
                if reply.get("failure"):
                    writer.close()
                    return reply["failure"]
                if reply["entries"]:
                    break
                writer.write((json.dumps(dict(poll, reqs=[], id=2 * step + 1)) + "\n").encode())
            seq = reply["entries"][-1]["seq"] + 1
            seen.extend(e["tensors"] for e in reply["entries"])
        await _call(reader, writer, {"cmd": "negotiate_bye", "done": seq - 1})
        writer.close()
        return seen

    async def sample():
        await joined.wait()
        threads_while_parked.append(proc_stat.status_int(pid, "Threads"))

    results = await asyncio.gather(*(rank(r) for r in range(RANKS)), sample())
    return results[:-1], threads_while_parked[0]


def test_two_hundred_ranks_join_and_negotiate_on_one_event_loop():
    proc = spawn(host="127.0.0.1", port=0)
    try:
        idle_threads = proc_stat.status_int(proc.proc.pid, "Threads")
        seen, threads = asyncio.run(_job(proc.address, "scale-" + uuid.uuid4().hex[:6], 4,
                                         proc.proc.pid))
        assert all(s == seen[0] for s in seen)  # one global order
        assert sum(len(t) for t in seen[0]) == 4  # every step's tensor, once
        assert threads <= idle_threads + 2, (idle_threads, threads)
    finally:
        proc.stop()


def test_a_dead_rank_among_two_hundred_is_named_to_the_others():
    proc = spawn(host="127.0.0.1", port=0)
    try:
        results, _ = asyncio.run(_job(proc.address, "die-" + uuid.uuid4().hex[:6], 3,
                                      proc.proc.pid, die=137))
        failures = [r for i, r in enumerate(results) if i != 137]
        assert all(isinstance(f, dict) and "rank 137 disconnected" in f["message"]
                   for f in failures), failures[:3]
    finally:
        proc.stop()
