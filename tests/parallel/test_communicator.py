"""The communicator as users run it: N processes under netreduce-run, the real
aggregator daemon and native data plane on loopback.

This file is also the worker: ``python test_communicator.py SCENARIO`` runs one
scenario as one rank (netreduce-run sets the rank variables), prints "OK <rank>"
when every check on that rank passed, and exits non-zero otherwise.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from typing import List

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- scenarios (run inside the ranks) ---------------------------------------------
def scenario_basic(nr) -> None:
    r, n = nr.rank(), nr.size()
    expect = n * (n - 1) / 2
    # sizes: empty, one element, just over one 64 KiB packet, many packets
    for count in (0, 1, 16367, 300_001):
        out = nr.allreduce(np.full(count, r, np.float32), op=nr.Sum, name=f"count{count}")
        assert out.shape == (count,) and (out == expect).all(), count
    avg = nr.allreduce(np.full(10, r, np.float64), name="avg")
    assert np.allclose(avg, (n - 1) / 2), avg
    # random data against numpy, every dtype the wire carries natively
    for dtype in ("float32", "float64", "int32", "int64", "float16"):
        data = [np.random.default_rng(100 + q).integers(-50, 50, (37, 11)).astype(dtype)
                for q in range(n)]
        got = nr.allreduce(data[r], op=nr.Sum, name=f"rand-{dtype}")
        np.testing.assert_array_equal(got, np.sum(data, axis=0).astype(dtype))
        mx = nr.allreduce(data[r], op=nr.Max, name=f"max-{dtype}")
        np.testing.assert_array_equal(mx, np.max(data, axis=0))
    floats = [np.random.default_rng(7 + q).standard_normal(5000).astype(np.float32)
              for q in range(n)]
    np.testing.assert_allclose(nr.allreduce(floats[r], name="randf"), np.mean(floats, axis=0),
                               rtol=1e-5, atol=1e-6)
    # 50 tensors, submitted in a different random order on every rank, three steps
    names = [f"grad{i}" for i in range(50)]
    for step in range(3):
        order = names[:]
        random.Random(1000 * step + r).shuffle(order)
        handles = {k: nr.allreduce_async(np.full((int(k[4:]) % 9 + 1, 4), r + int(k[4:]),
                                                 np.float32), op=nr.Sum, name=k) for k in order}
        for k, h in handles.items():
            want = sum(q + int(k[4:]) for q in range(n))
            assert (nr.synchronize(h) == want).all(), k
            assert nr.poll(h) is True, k  # done once synchronize returned
    g = nr.grouped_allreduce([np.full(3, r, np.int32), np.full(2, 1, np.int32)], op=nr.Sum,
                             name="grp")
    assert (g[0] == expect).all() and (g[1] == n).all()
    b = nr.broadcast(np.arange(6, dtype=np.float32) * (r + 1), root_rank=n - 1, name="bc")
    assert (b == np.arange(6) * n).all()
    assert nr.broadcast_object({"root": r, "data": list(range(r + 3))}, root_rank=0) == \
        {"root": 0, "data": [0, 1, 2]}
    assert nr.allgather_object(f"rank{r}") == [f"rank{q}" for q in range(n)]
    nr.barrier()


def scenario_errors(nr) -> None:
    from netreduce.errors import NegotiationError
    r = nr.rank()
    try:
        nr.allreduce(np.zeros((2, 3) if r == 0 else (3,), np.float32), name="mismatch")
        raise AssertionError("mismatch not detected")
    except NegotiationError as exc:
        msg = str(exc)
        assert "Mismatched allreduce tensor shapes: One rank sent a tensor of shape [2, 3], " \
               "but another rank sent a tensor of shape [3]" in msg, msg
        assert "'mismatch'" in msg and "rank 0" in msg and "rank 1" in msg, msg
    h = nr.allreduce_async(np.ones(4, np.float32), name="dup")
    try:
        nr.allreduce_async(np.ones(4, np.float32), name="dup")
        raise AssertionError("duplicate name accepted")
    except ValueError as exc:
        assert "already being reduced" in str(exc)
    assert (nr.synchronize(h) == 1).all()
    try:
        nr.allreduce(np.zeros((4, 4), np.float32)[:, 0], name="strided")
        raise AssertionError("non-contiguous accepted")
    except ValueError as exc:
        assert "C-contiguous" in str(exc)
    # a tensor only rank 0 submits: after the stall timeout rank 0 is told who is missing
    # (the warning the test reads on its stderr); rank 0 goes on once it has been given,
    # not after a fixed 2 s (rank 1 waits in the barrier meanwhile)
    if r == 0:
        import logging
        import threading
        warned = threading.Event()

        def seen(record):  # a filter that passes everything: the warning's output path
            if "only-on-rank-0" in record.getMessage():  # (stderr) stays as it was
                warned.set()
            return True
        logging.getLogger("netreduce").addFilter(seen)
        h = nr.allreduce_async(np.ones(2, np.float32), name="only-on-rank-0")
        assert warned.wait(30), "no stall warning within 30 s"
        assert not nr.poll(h)
    nr.barrier()


def scenario_death(nr) -> None:
    from netreduce.errors import RankFailedError
    r = nr.rank()
    nr.allreduce(np.ones(1000, np.float32), name="warmup")
    if r == 1:
        os._exit(0)  # as if killed: no shutdown(), sockets closed by the kernel
    t0 = time.monotonic()
    try:
        nr.allreduce(np.ones(200_000, np.float32), name="needs-rank-1")
        raise AssertionError("operation succeeded without rank 1")
    except RankFailedError as exc:
        assert exc.rank == 1 and "rank 1" in str(exc), str(exc)
    assert time.monotonic() - t0 < 10.0  # NETREDUCE_TIMEOUT in the test below


def scenario_shutdown(nr) -> None:
    from netreduce.errors import RankFailedError
    r = nr.rank()
    nr.allreduce(np.ones(10, np.float32), name="warmup")
    if r == 1:
        nr.shutdown()
        return
    time.sleep(0.5)  # mostly idle here when rank 1 leaves: nothing raised until we submit
    try:  # fails at submission if rank 1's departure is already known, else on wait
        h = nr.allreduce_async(np.ones(10, np.float32), name="needs-rank-1")
        nr.synchronize(h)
        raise AssertionError("operation succeeded without rank 1")
    except RankFailedError as exc:
        text = str(exc)
        assert exc.rank == 1 and "rank 1 called shutdown()" in text, text
        # the operation, the rank it runs on and the aggregator, not a claim about
        # what this rank had pending when rank 1 left
        assert "rank 0 of job" in text and "tensor 'needs-rank-1'" in text, text
        assert f"aggregator {os.environ['NETREDUCE_SWITCH']}" in text, text
        assert "still had operations" not in text, text


def scenario_reinit(nr) -> None:
    """shutdown() and init() again in the same process. Rank 0 comes back while rank 1
    is still in the first run; the job carries on once both are back."""
    r = nr.rank()
    assert (nr.allreduce(np.full(5, r + 1, np.float32), op=nr.Sum, name="first") == 3).all()
    if r == 1:
        time.sleep(1.0)
    nr.shutdown()
    nr.init()
    out = nr.allreduce(np.full(70_000, r + 10, np.float32), op=nr.Sum, name="second")
    assert (out == 21).all(), out[:3]


def scenario_timeline(nr) -> None:
    for step in range(3):
        nr.grouped_allreduce([np.ones(100, np.float32), np.ones(7, np.float32)], name="layer")


def scenario_switch_dies(nr) -> None:
    """The test kills the aggregator after the warm-up; the next operation must fail
    with an error that names the aggregator's address, not hang."""
    from netreduce.errors import NetReduceError
    r, d = nr.rank(), os.environ["SCENARIO_DIR"]
    nr.allreduce(np.ones(10, np.float32), name="warmup")
    open(os.path.join(d, f"ready.{r}"), "w").close()
    while not os.path.exists(os.path.join(d, "killed")):
        time.sleep(0.05)
    try:
        nr.allreduce(np.ones(100_000, np.float32), name="no-aggregator")
        raise AssertionError("operation succeeded without an aggregator")
    except NetReduceError as exc:
        assert os.environ["NETREDUCE_SWITCH"] in str(exc), str(exc)
    nr.shutdown()


def scenario_join(nr) -> None:
    """Uneven inputs (Horovod's join): rank r runs r+1 steps, then joins; the joined
    ranks contribute zeros, and join() returns the last rank to join on every rank."""
    r, n = nr.rank(), nr.size()
    for step in range(r + 1):
        want = sum(q + 1 for q in range(n) if q >= step)  # ranks still submitting
        s = nr.allreduce(np.full(70_000, r + 1, np.float32), op=nr.Sum, name="big")
        assert (s == want).all(), (step, s[:3], want)
        a = nr.allreduce(np.full(5, r + 1, np.float64), name="avg")
        assert np.allclose(a, want / n), (step, a, want)  # Average divides by size()
        g = nr.grouped_allreduce([np.full(7, r + 1, np.int64), np.full(3, 2, np.int32)],
                                 op=nr.Sum, name="grp")
        live = sum(1 for q in range(n) if q >= step)
        assert (g[0] == want).all() and (g[1] == 2 * live).all(), (step, g)
    last = nr.join()
    assert last == n - 1, last
    assert nr.allgather_object(last) == [n - 1] * n  # everything is normal again
    out = nr.allreduce(np.ones(3, np.float32), op=nr.Sum, name="after-join")
    assert (out == n).all(), out


def worker(name: str) -> None:
    import netreduce as nr
    nr.init()
    rank = nr.rank()
    globals()[f"scenario_{name}"](nr)
    if nr.is_initialized():
        nr.shutdown()
    print(f"OK {rank}", flush=True)


# --- tests (run by pytest) ----------------------------------------------------------
def launch(np_: int, scenario: str, timeout: float = 90.0, **env: str):
    full = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                NETREDUCE_TIMEOUT="10", **env)
    full.pop("NETREDUCE_SWITCH", None)
    return subprocess.run([sys.executable, "-m", "netreduce.launcher", "-np", str(np_),
                           sys.executable, os.path.abspath(__file__), scenario],
                          env=full, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def ok_ranks(proc) -> List[int]:
    from tests.procs import unprefixed
    return sorted(int(line.split()[-1]) for line in proc.stdout.splitlines()
                  if unprefixed(line).split()[:1] == ["OK"])


import pytest  # noqa: E402  (the worker half above must not need pytest)


@pytest.mark.slow
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_basic(size):
    proc = launch(size, "basic")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ok_ranks(proc) == list(range(size))


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 3])
def test_join_with_uneven_steps(size):
    proc = launch(size, "join")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ok_ranks(proc) == list(range(size))


@pytest.mark.slow
def test_error_paths():
    proc = launch(2, "errors", NETREDUCE_STALL_TIMEOUT="0.5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ok_ranks(proc) == [0, 1]
    warning = [ln for ln in proc.stderr.splitlines() if "only-on-rank-0" in ln]
    assert warning and warning[0].startswith("[0]<stderr>:") and "rank(s) 1" in warning[0], proc.stderr


@pytest.mark.slow
def test_dead_rank_fails_the_others_naming_it():
    t0 = time.monotonic()
    proc = launch(3, "death")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ok_ranks(proc) == [0, 2]
    assert time.monotonic() - t0 < 40


@pytest.mark.slow
def test_shutdown_rank_fails_the_others_naming_it():
    proc = launch(2, "shutdown")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ok_ranks(proc) == [0, 1]


@pytest.mark.slow
def test_init_again_after_shutdown():
    proc = launch(2, "reinit")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ok_ranks(proc) == [0, 1]


@pytest.mark.slow
def test_aggregator_death_fails_the_ranks_naming_it(tmp_path):
    from netreduce.switch import spawn
    switch = spawn(host="127.0.0.1", port=0)
    address = f"{switch.address[0]}:{switch.address[1]}"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               NETREDUCE_TIMEOUT="3", SCENARIO_DIR=str(tmp_path))
    launcher = subprocess.Popen([sys.executable, "-m", "netreduce.launcher", "-np", "2",
                                 "--switch", address, sys.executable, os.path.abspath(__file__),
                                 "switch_dies"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("ready.*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            assert launcher.poll() is None, launcher.communicate()
    finally:
        switch.stop()
    (tmp_path / "killed").touch()
    out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, out + err
    from tests.procs import unprefixed
    assert sorted(ln.split()[-1] for ln in out.splitlines()
                  if " OK " in f" {unprefixed(ln)}") == ["0", "1"]


@pytest.mark.slow
def test_timeline(tmp_path):
    path = tmp_path / "timeline.json"
    proc = launch(2, "timeline", NETREDUCE_TIMELINE=str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = json.loads(path.read_text())
    phases = {e["name"] for e in events if e["ph"] == "X"}
    # the first step through the coordinator (negotiate, wait_for_ranks); the cached
    # steps after it agreed among the ranks (queued, and the agreement's round)
    assert phases == {"negotiate", "wait_for_ranks", "queued", "round", "copy_in",
                      "allreduce", "copy_out"}
    fused = [e for e in events if e["name"] == "allreduce"]
    assert fused and all(e["args"]["fused"] == 2 for e in fused)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    worker(sys.argv[1])
