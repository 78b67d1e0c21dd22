"""Run phases of concurrent flows through SimGrid's flow-level network model.

Input (JSON on stdin, or ``run()`` in a fresh process): the directed edges of a
topology (capacity in bytes/s, latency in s) and a list of *phases*; a phase is a
set of flows ``[src, dst, [edge, ...], bytes]`` that all start together, and the
next phase starts when the last flow of this one has arrived. Output: each phase's
simulated duration.

Every directed edge is a SimGrid link (SHARED: the flows on it share its capacity
max-min fairly, solved by SimGrid's LMM solver). Every flow is a direct
host-to-host communication (``Comm.sendto_async``) along exactly the edges given,
so the routes are the ones a placement or ECMP hash chose, not SimGrid's own. Two
flows between one pair of nodes on different paths get endpoint aliases (SimGrid
keeps one route per pair); aliases have no link of their own, so they cost nothing.

The model is CM02 (plain max-min sharing, no TCP correction factors): the callers
put protocol overhead into the flows' byte counts themselves, from the wire bytes
the testbed measured, so the calibration is explicit rather than hidden in
SimGrid's LV08 factors. SimGrid cannot be initialised twice in one process, hence
``run()`` spawns one process per simulation.

Optional host software time (``compute``: per phase, {node: seconds}): the named
node's actor runs a SimGrid ``exec`` of that many seconds on its host (speed
HOST_FLOPS, one core: execs on one host share it) before it starts its flows of
the phase — time the sender spends in software that is not overlapped with the
wire (benchmarks/sim/software.py says what is charged and where it was measured).
Without ``compute`` every flow starts at the phase's start, as before."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence

Flow = Sequence[Any]  # (src, dst, [edge indices], bytes)
HOST_FLOPS = 1e9  # every simulated host's speed; an exec of t seconds is t * HOST_FLOPS


def run(edges: Sequence[Sequence[float]], phases: Sequence[Sequence[Flow]],
        timeout: float = 1800.0, flow_ends: bool = False,
        compute: Optional[Sequence[Dict[str, float]]] = None) -> Dict[str, Any]:
    """Simulate ``phases`` over ``edges`` [(capacity B/s, latency s)] in a child
    process; ``compute``: per phase, {node: software seconds before its flows}.
    Returns {"durations": seconds per phase, "flow_ends": per phase, each flow's
    arrival time after the phase's start (when ``flow_ends``)}."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec: Dict[str, Any] = {"edges": [list(e) for e in edges],
                            "phases": [[list(f) for f in ph] for ph in phases],
                            "flow_ends": flow_ends}
    if compute is not None:
        if len(compute) != len(phases):
            raise ValueError("compute needs one {node: seconds} per phase")
        spec["compute"] = [dict(c) for c in compute]
    payload = json.dumps(spec)
    env = dict(os.environ)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.sim.engine"], input=payload,
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=root)
    if proc.returncode != 0:
        raise RuntimeError(f"SimGrid run failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def simulate(spec: Dict[str, Any]) -> Dict[str, Any]:
    from benchmarks.sim.simgrid_loader import load
    sg = load()
    engine = sg.Engine(["netreduce-sim", "--cfg=network/model:CM02",
                        "--cfg=network/TCP-gamma:0",  # no window cap: rates are link-bound
                        "--cfg=network/crosstraffic:0",  # ACK traffic is in WIRE, not here
                        "--log=root.thres:critical"])
    zone = sg.NetZone.create_full_zone("fabric")
    edges = spec["edges"]
    links: Dict[int, Any] = {}
    hosts: Dict[str, Any] = {}
    routes: Dict[tuple, tuple] = {}  # (src, dst, path) -> (src host, dst host)
    aliases: Dict[tuple, int] = {}

    def link(e: int) -> Any:
        if e not in links:
            cap, lat = edges[e]
            links[e] = zone.create_link(f"e{e}", float(cap)).set_latency(float(lat)).seal()
        return links[e]

    def host(name: str) -> Any:
        if name not in hosts:
            hosts[name] = zone.create_host(name, HOST_FLOPS).seal()
        return hosts[name]

    driver = host("__driver__")
    phases: List[List[tuple]] = []
    for phase in spec["phases"]:
        flows = []
        for src, dst, path, nbytes in phase:
            key = (src, dst, tuple(path))
            if key not in routes:
                k = aliases.get((src, dst), 0)
                aliases[(src, dst)] = k + 1
                a = host(src if k == 0 else f"{src}~{k}")
                b = host(dst if k == 0 else f"{dst}~{k}")
                zone.add_route(a.netpoint, b.netpoint, None, None,
                               [sg.LinkInRoute(link(e)) for e in path], False)
                routes[key] = (a, b)
            flows.append((routes[key], int(nbytes), src))
        phases.append(flows)
    zone.seal()
    durations: List[float] = []

    ends: List[List[float]] = []

    compute = spec.get("compute")
    for c in compute or []:
        for name in c:
            host(name)

    def sender(name: str, seconds: float, mine: List[tuple], start: float,
               out: List[float]) -> Any:
        def body() -> None:
            if seconds > 0:
                sg.this_actor.execute(seconds * HOST_FLOPS)
            comms = [(i, sg.Comm.sendto_async(a, b, n)) for i, (a, b), n in mine]
            sg.Comm.wait_all([c for _, c in comms])
            for i, c in comms:
                out[i] = c.finish_time - start
        return sg.Actor.create(f"send-{name}", hosts[name], body)

    def drive() -> None:
        for p, flows in enumerate(phases):
            start = sg.Engine.clock
            if compute is None:
                comms = [sg.Comm.sendto_async(a, b, n) for (a, b), n, _ in flows if n > 0]
                sg.Comm.wait_all(comms)
                it = iter(comms)
                fin = [next(it).finish_time - start if n > 0 else 0.0 for _, n, _ in flows]
            else:
                fin = [0.0] * len(flows)
                by_src: Dict[str, List[tuple]] = {}
                for i, (pair, n, src) in enumerate(flows):
                    if n > 0:
                        by_src.setdefault(src, []).append((i, pair, n))
                for name in compute[p]:
                    by_src.setdefault(name, [])
                actors = [sender(name, float(compute[p].get(name, 0.0)), mine, start, fin)
                          for name, mine in by_src.items()]
                for a in actors:
                    a.join()
            durations.append(sg.Engine.clock - start)
            if spec.get("flow_ends"):
                ends.append(fin)

    sg.Actor.create("driver", driver, drive)
    engine.run()
    return {"durations": durations, "flow_ends": ends}


def main() -> None:
    spec = json.loads(sys.stdin.read())
    sys.stdout.write(json.dumps(simulate(spec)) + "\n")


if __name__ == "__main__":
    main()
