"""torchrun elastic with the netreduce backend (issue 32 item 4): two torchrun agents
— two nodes of 2 workers on loopback, ``--nnodes 1:2 --rdzv-backend c10d
--max-restarts 3`` — training through ``init_process_group("netreduce")``; one node
(its agent and workers) SIGKILLed: training goes on at world size 2; the node back:
world size 4. torchrun restarts every worker at each change; they resume from rank
0's checkpoint.

The c10d rendezvous store is this test's own TCPStore (as an etcd or a head node
would be), so that killing a node never kills the rendezvous. torch 2.13's TCPStore
sharing (its default) loses a node that joins a later round — it waits for a
MASTER_ADDR that the round's rank 0 never publishes again, gloo and netreduce alike —
so the agents run with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (docs/elastic.md)."""
from __future__ import annotations

import datetime
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from netreduce.testbed import proc_stat
from tests.procs import ROOT

WORKER = os.path.join(ROOT, "tests", "parallel", "torchrun_elastic_worker.py")


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _records(out):
    rows = []
    for path in glob.glob(os.path.join(out, "log-*.jsonl")):
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


@pytest.mark.slow  # torchrun's own rendezvous rounds take ~20 s per change
@pytest.mark.timeout(400)
def test_torchrun_nodes_leave_and_come_back(tmp_path):
    torch_distributed = pytest.importorskip("torch.distributed")
    out = str(tmp_path)
    port = _free_port()
    store = torch_distributed.TCPStore("127.0.0.1", port, is_master=True, multi_tenant=True,
                                       timeout=datetime.timedelta(seconds=300))
    env = dict(os.environ, ELASTIC_OUT=out, OMP_NUM_THREADS="1",
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    for var in ("NETREDUCE_SWITCH", "NETREDUCE_RANK", "NETREDUCE_SIZE", "NETREDUCE_JOB",
                "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env.pop(var, None)
    agents = []

    def agent(name):
        log = open(os.path.join(out, f"agent-{name}.log"), "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2",
             "--nproc-per-node", "2", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "elastic-test",
             # a killed node leaves the rendezvous once it has missed keep_alive_max_attempt
             # heartbeats: 5 of 1 s each, not torch's 3 of 5 s (the survivor's next round
             # waits for that, then last_call_timeout)
             "--rdzv-conf", "is_host=false,last_call_timeout=3,join_timeout=120,"
                            "keep_alive_interval=1,keep_alive_max_attempt=5",
             "--max-restarts", "3", "--monitor-interval", "0.5", WORKER],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        agents.append(proc)
        return proc

    def wait_for(what, timeout=150):
        deadline = time.monotonic() + timeout
        while not what():
            assert time.monotonic() < deadline, [open(p).read()[-3000:] for p in
                                                 glob.glob(os.path.join(out, "agent-*.log"))]
            time.sleep(0.2)

    def sizes_since(t):
        return {r["size"] for r in _records(out) if "size" in r and r.get("t", 0) > t}

    try:
        first = agent("A")
        second = agent("B")
        wait_for(lambda: any(r.get("size") == 4 and r["step"] >= 10 for r in _records(out)))
        victims = proc_stat.children(second.pid)
        os.killpg(second.pid, signal.SIGKILL)  # the node: its agent and its workers
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        second.wait()
        killed = time.time()
        wait_for(lambda: any(r.get("size") == 2 for r in _records(out) if r.get("t", 0) > killed
                             and r["step"] >= 3 + max(q["step"] for q in _records(out)
                                                      if q.get("size") == 4)))
        back = agent("B2")
        returned = time.time()
        wait_for(lambda: 4 in sizes_since(returned))
        open(os.path.join(out, "stop"), "w").close()
        assert first.wait(120) == 0 and back.wait(120) == 0, \
            [open(p).read()[-3000:] for p in glob.glob(os.path.join(out, "agent-*.log"))]
    finally:
        for proc in agents:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        del store
    rows = sorted((r for r in _records(out) if "step" in r), key=lambda r: r["t"])
    by_rank0 = [r for r in rows if r["rank"] == 0]
    phases = [r["size"] for i, r in enumerate(by_rank0) if i == 0 or by_rank0[i - 1]["size"] != r["size"]]
    assert phases == [4, 2, 4], phases
    # each restart resumed from the checkpoint: the step count never went back to 0
    starts = [r["step"] for i, r in enumerate(by_rank0) if i and by_rank0[i - 1]["size"] != r["size"]]
    assert all(s > 10 for s in starts), starts
    finals = [r for r in _records(out) if "final" in r]
    assert sorted(r["rank"] for r in finals) == [0, 1, 2, 3], finals
    assert len({r["final"] for r in finals}) == 1, "the last round's ranks hold different parameters"
