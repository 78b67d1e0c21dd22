"""Two levels on loopback: a spine and two rack aggregators (netreduce-switch --spine),
two rank processes per rack; every rank registers at the spine (NETREDUCE_SWITCH)
and sends its data through its rack aggregator (NETREDUCE_RACK_SWITCH).

Checked: exact results for sizes 0, 1, a packet +-1, several MiB and every dtype;
loss on the worker hop (engine drop knob), on the rack-spine hop (the rack
aggregators' drop knob) and on both, still exact, with the spine's and the racks'
counters showing that every byte was added exactly once (bytes_reduced = members x
bytes) while resent partials arrived as duplicates; a spine result lost (and the
racks' timer too slow to repair it) brought back by the members' resends; the spine
killed mid-job gives every rank an error naming the spine's and its rack aggregator's
addresses; a job secret at the spine (--require-secret) composes with the tree."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from netreduce.worker import dataplane
from netreduce.protocol.client import ControlClient
from netreduce.errors import NetReduceError
from tests.parallel.ranks import rank_barrier, run_ranks
from tests.procs import ROOT, collect_ok

PAYLOAD = 65464
F32_PER_PACKET = PAYLOAD // 4
SIZES = [0, 1, F32_PER_PACKET - 1, F32_PER_PACKET + 1, 3 * 2**20 // 4 + 7]
DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64"]
WIRE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8}


def _job() -> str:
    return "tree-" + uuid.uuid4().hex[:8]


@pytest.fixture
def tree(request):
    """spawn(rack_args=[...], spine_args=[...]) -> (spine, [rack0, rack1])."""
    from netreduce.switch import spawn
    started = []

    def start(rack_args=(), spine_args=()):
        # unicast unless a test says otherwise: the packet arithmetic below is unicast's
        rack_args, spine_args = ["--fanout", "unicast", *rack_args], ["--fanout", "unicast", *spine_args]
        spine = spawn(host="127.0.0.1", port=0, extra_args=list(spine_args))
        started.append(spine)
        racks = []
        for _ in range(2):
            racks.append(spawn(host="127.0.0.1", port=0,
                               extra_args=["--spine", "127.0.0.1", *rack_args]))
            started.append(racks[-1])
        return spine, racks

    yield start
    for proc in started:
        proc.stop()


def _values(dtype, rank, count, seed):
    """Small integers in the dtype (bfloat16 as its bits): every sum is exact."""
    v = np.random.default_rng(seed * 16 + rank).integers(-8, 8, count)
    if dtype == "bfloat16":
        return (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return v.astype(dtype)


def _as_float(a, dtype):
    return (a.astype(np.uint32) << 16).view(np.float32) if dtype == "bfloat16" else a


def _cases():
    out = []
    for i, count in enumerate(SIZES):
        out.append(("float32", "sum", count, i))
    for j, dtype in enumerate(DTYPES):
        for k, op in enumerate(("sum", "min", "max")):
            out.append((dtype, op, 50_003 if op == "sum" else 20_001, 100 + 3 * j + k))
    return out


def _wire_bytes(cases) -> int:
    return sum(count * WIRE_BYTES[dtype] for dtype, _, count, _ in cases)


def _rack_counters(racks, job):
    """Each rack aggregator's counters of ``job`` once it has the spine's answer to
    every partial it sent (or after 10 s, and then the caller's check fails with them)."""
    out = []
    for address in racks:
        deadline = time.monotonic() + 10.0
        with ControlClient(address) as c:
            while True:
                rc = c.call("counters")["jobs"][job]
                if rc["uplink_results_received"] == rc["uplink_partials_sent"] or \
                        time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            out.append(rc)
    return out


def _rank(rank, size, spine, racks, job, cases, kw, secret=""):
    os.environ["NETREDUCE_RACK_SWITCH"] = "%s:%d" % racks[rank * len(racks) // size]
    if secret:
        os.environ["NETREDUCE_JOB_SECRET"] = secret
    with dataplane.connect(spine, job, rank, size, timeout=20.0, **kw) as conn:
        for dtype, op, count, seed in cases:
            mine = _values(dtype, rank, count, seed)
            conn.allreduce(mine, op=op, dtype="bfloat16" if dtype == "bfloat16" else None)
            every = [_as_float(_values(dtype, r, count, seed), dtype).astype(np.float64)
                     for r in range(size)]
            ref = {"sum": np.sum, "min": np.min, "max": np.max}[op](every, axis=0) if every[0].size \
                else np.zeros(0)
            np.testing.assert_array_equal(_as_float(mine, dtype).astype(np.float64), ref,
                                          err_msg=f"{dtype} {op} {count}")
        out = {"stats": conn.stats(), "rack": conn.rack_index, "racks": conn.racks}
        if rank == 0:
            # This rank's results mean the spine completed every slot; the other rack
            # may still be waiting for (or re-asking) the spine's answer to its last
            # partials, so its counters are read once it has them all (or after 10 s,
            # and then the check below fails with them).
            out["spine"] = conn.counters()["jobs"][job]
            out["rack_counters"] = _rack_counters(racks, job)
        return out


def _check_once(results, cases):
    """Every byte added exactly once at every level."""
    total = _wire_bytes(cases)
    spine = results[0]["spine"]
    assert spine["members"] == 2 and spine["bytes_reduced"] == 2 * total, spine
    for rc in results[0]["rack_counters"]:
        assert rc["members"] == 2 and rc["bytes_reduced"] == 2 * total, rc
        assert rc["uplink_results_received"] == rc["uplink_partials_sent"], rc
    assert [r["rack"] for r in results] == [0, 0, 1, 1]
    assert all(r["racks"] == 2 for r in results)
    return spine, results[0]["rack_counters"]


def test_exact_through_rack_and_spine(tree):
    spine, racks = tree()
    cases = _cases()
    results = run_ranks(_rank, 4, spine.address, [r.address for r in racks], _job(), cases, {})
    spine_c, rack_c = _check_once(results, cases)
    # One partial per slot per rack reached the spine; the only duplicates there are
    # the racks' timeout probes (a loaded host can make the spine look slow).
    assert spine_c["slots_completed"] == rack_c[0]["uplink_partials_sent"], (spine_c, rack_c)
    assert spine_c["duplicates"] <= sum(rc["uplink_partials_resent"] for rc in rack_c)
    # Stale drops are late needless resends of a slot's previous round (a loaded host
    # delays results), not a fault: every other reason must stay at zero.
    assert spine_c["drops"] - spine_c["drop_stale"] == 0 and \
        all(rc["drops"] - rc["drop_stale"] == 0 for rc in rack_c), (spine_c, rack_c)
    # What a rack sends: one partial per slot up (and its probes), one result per
    # member down (and the answers to the members' resends, and the held notices of
    # their first messages' chunks).
    for rc in rack_c:
        assert rc["packets_out"] == (rc["uplink_partials_sent"] + rc["uplink_partials_resent"]
                                     + 2 * rc["slots_completed"] + rc["retransmitted_results"]
                                     + rc["held_notices"]), rc


@pytest.mark.parametrize("hop", ["worker", "uplink", "both"])
def test_loss_on_either_hop_is_repaired_once(tree, hop):
    rack_args = ["--uplink-drop-rate", "0.05", "--uplink-rto-ms", "2"] if hop != "worker" else []
    kw = {"drop_rate": 0.05, "retransmit_ms": 2.0} if hop != "uplink" else {}
    spine, racks = tree(rack_args=rack_args)
    cases = _cases()[:5] + [("float16", "sum", 50_003, 7), ("int64", "max", 20_001, 8)]
    results = run_ranks(_rank, 4, spine.address, [r.address for r in racks], _job(), cases, kw)
    spine_c, rack_c = _check_once(results, cases)
    if hop != "worker":
        assert sum(rc["uplink_dropped"] for rc in rack_c) > 0
        assert sum(rc["uplink_partials_resent"] for rc in rack_c) > 0
        # Resent partials whose first copy did arrive: recognised, not added again.
        assert spine_c["duplicates"] > 0
    if hop != "uplink":
        assert sum(r["stats"]["dropped_by_knob"] for r in results) > 0
        assert sum(rc["duplicates"] for rc in rack_c) > 0


def _after_lost_result(rank, size, spine, racks, job):
    """A one-packet message whose spine result each rack loses (--uplink-drop-results
    1), then a message of many packets; the counters once every rank has both."""
    os.environ["NETREDUCE_RACK_SWITCH"] = "%s:%d" % racks[rank * len(racks) // size]
    with dataplane.connect(spine, job, rank, size, timeout=10.0) as conn:
        one = np.full(1000, rank + 1, np.float32)
        conn.allreduce(one)
        many = np.arange(300_001, dtype=np.int32) * (rank + 1)
        conn.allreduce(many)
        ok = bool((one == size * (size + 1) // 2).all()) and \
            bool((many == np.arange(300_001, dtype=np.int32) * (size * (size + 1) // 2)).all())
        out = {"exact": ok}
        if rank == 0:
            out["spine"] = conn.counters()["jobs"][job]
            out["rack_counters"] = _rack_counters(racks, job)
        return out


def test_members_resend_brings_back_a_lost_spine_result(tree):
    """Each rack loses the spine's result of the job's first slot. The racks' timer
    cannot repair it within the ranks' 10 s (--uplink-rto-ms 60000: before a sample
    that is the partial's timeout), and nothing overtakes it (one packet). The members'
    resends (held probes) reach a slot that waits on the spine: the rack resends the
    partial, the spine answers the duplicate with the stored result. Before that, the
    resends were only marked and every rank timed out."""
    spine, racks = tree(rack_args=["--uplink-drop-results", "1", "--uplink-rto-ms", "60000"])
    results = run_ranks(_after_lost_result, 4, spine.address, [r.address for r in racks], _job())
    assert all(r["exact"] for r in results), results
    spine_c, rack_c = results[0]["spine"], results[0]["rack_counters"]
    for rc in rack_c:
        assert rc["uplink_dropped"] == 1, rc
        assert rc["uplink_results_received"] == rc["uplink_partials_sent"], rc
        assert rc["uplink_repeat_resends"] >= 1, rc
        assert rc["uplink_partials_resent"] >= rc["uplink_repeat_resends"], rc
        assert rc["members"] == 2 and rc["drops"] - rc["drop_stale"] == 0, rc
    # The resent partials were recognised at the spine, not added again.
    assert spine_c["duplicates"] >= 2 and spine_c["retransmitted_results"] >= 2, spine_c
    assert spine_c["bytes_reduced"] == 2 * (1000 * 4 + 300_001 * 4), spine_c


def test_uplink_rto_floor_above_one_second_holds(tree):
    """--uplink-rto-ms above the 1 s backoff cap is the floor after the first sample
    too (it was cut to 1 s once the spine's round trip was sampled)."""
    spine, racks = tree(rack_args=["--uplink-rto-ms", "3000"])
    cases = [("float32", "sum", 3 * F32_PER_PACKET + 5, 1)]
    results = run_ranks(_rank, 4, spine.address, [r.address for r in racks], _job(), cases, {})
    _, rack_c = _check_once(results, cases)
    for rc in rack_c:
        assert rc["uplink_results_received"] >= 1 and rc["uplink_rto_us"] == 3_000_000, rc


def _until_spine_dies(rank, size, spine, racks, job, spine_pid, all_done):
    os.environ["NETREDUCE_RACK_SWITCH"] = "%s:%d" % racks[rank * len(racks) // size]
    with dataplane.connect(spine, job, rank, size, timeout=3.0) as conn:
        a = np.ones(1000, dtype=np.float32)
        conn.allreduce(a)
        assert (a == size).all()
        # The spine sends a result to one rack, then the other: rank 0 holding it does
        # not mean rack 1 has it yet, so the kill waits for every rank.
        all_done.wait(timeout=30)
        if rank == 0:
            os.kill(spine_pid, signal.SIGKILL)
        try:
            conn.allreduce(np.ones(100_000, dtype=np.float32))
        except NetReduceError as exc:
            return str(exc)
        return "no error"


def test_spine_killed_names_the_spine(tree):
    spine, racks = tree()
    errors = run_ranks(_until_spine_dies, 4, spine.address, [r.address for r in racks], _job(),
                       spine.proc.pid, rank_barrier(4), timeout=60)
    spine_at = "%s:%d" % spine.address
    for rank, message in enumerate(errors):
        rack_at = "%s:%d" % racks[rank // 2].address
        assert spine_at in message and f"via rack aggregator {rack_at}" in message, message


def test_job_secret_at_the_spine(tree):
    spine, racks = tree(spine_args=["--require-secret"])
    cases = [("float32", "sum", 100_000, 1), ("int32", "sum", 3, 2)]
    results = run_ranks(_rank, 4, spine.address, [r.address for r in racks], _job(), cases, {},
                        "s3cret-tree")
    _check_once(results, cases)


def _first_error(spine, job, rank, size, timeout):
    """What a rank's connect() and first all-reduce end in: the error's text, or "no
    error" (the last rank to register asks for its grant inside connect())."""
    try:
        with dataplane.connect(spine, job, rank, size, timeout=timeout) as conn:
            conn.allreduce(np.ones(10, dtype=np.float32))
    except NetReduceError as exc:
        return str(exc)
    return "no error"


def _mixed(rank, size, spine, racks, job):
    if rank < 2:
        os.environ["NETREDUCE_RACK_SWITCH"] = "%s:%d" % racks[0]
    return _first_error(spine, job, rank, size, timeout=3.0)


def test_rack_on_some_ranks_only_is_refused_by_name(tree):
    spine, racks = tree()
    errors = run_ranks(_mixed, 4, spine.address, [r.address for r in racks], _job(), timeout=60)
    for message in errors[:2]:
        assert "rank(s) 2, 3 have not asked for their rack aggregator" in message, message
        assert "NETREDUCE_RACK_SWITCH" in message
    for message in errors[2:]:  # they wait on ranks that wait on them: the timeout names it
        assert message != "no error"


def _rack_ranks(spine, racks, job, timeout, *args):
    """Four multi_aggregator_worker.py ranks (ARGS its mode), two per rack aggregator,
    negotiating at the spine; flat (one host: auto would take shared memory);
    NETREDUCE_TIMEOUT ``timeout``."""
    here = os.path.dirname(os.path.abspath(__file__))
    procs = []
    for r in range(4):
        env = dict(os.environ, NETREDUCE_SWITCH="%s:%d" % spine.address,
                   NETREDUCE_RACK_SWITCH="%s:%d" % racks[r // 2].address, NETREDUCE_JOB=job,
                   NETREDUCE_RANK=str(r), NETREDUCE_SIZE="4", NETREDUCE_TIMEOUT=timeout,
                   NETREDUCE_ALGORITHM="flat",
                   PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(here, "multi_aggregator_worker.py"), *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


@pytest.mark.slow
def test_public_api_negotiates_at_the_spine(tree):
    """netreduce.init/allreduce on every rank: negotiation at the spine, data through
    the racks; every dtype x op x size exact and identical on every rank."""
    spine, racks = tree()
    results = collect_ok(_rack_ranks(spine, racks, _job(), "20", "exact"), timeout=240)
    for r in results:
        assert "failure" not in r and r["algorithm"] == "flat" and r["checked"] == 72, r
    assert len({r["digest"] for r in results}) == 1


def test_rack_jobs_only_from_the_configured_spine():
    from netreduce.switch import spawn
    with spawn(host="127.0.0.1", port=0, extra_args=["--spine", "127.0.0.2"]) as rack, \
            spawn(host="127.0.0.1", port=0) as plain:
        request = dict(job="x", size=2, members=[0], payload_bytes=1024,
                       spine=dict(host="127.0.0.2", port=4791, threads=1, job_index=1, key=5,
                                  rank=0, racks=1))
        with ControlClient(rack.address) as c:
            with pytest.raises(NetReduceError, match="taken from the spine 127.0.0.2 only, "
                                                     "not from 127.0.0.1"):
                c.call("rack_job", **request)
        with ControlClient(plain.address) as c:
            with pytest.raises(NetReduceError, match="takes no rack jobs: start it with --spine"):
                c.call("rack_job", **request)


@pytest.mark.parametrize("rack_args, spine_args", [
    (["--threads", "2"], ["--threads", "3"]),   # spine results arrive on any rack thread
    (["--fanout", "multicast"], ["--fanout", "multicast"]),  # racks multicast, spine unicasts
])
def test_threads_and_fanout(tree, rack_args, spine_args):
    spine, racks = tree(rack_args=rack_args, spine_args=spine_args)
    cases = _cases()[:5] + [("float16", "sum", 50_003, 9), ("bfloat16", "max", 20_001, 10)]
    results = run_ranks(_rank, 4, spine.address, [r.address for r in racks], _job(), cases, {})
    _check_once(results, cases)


def _owners(rank, size, spine, racks, job, count):
    """Owner delivery (reduce-scatter shards) through the tree: each rank's stretch
    goes to its owner only; the others get completion notices."""
    os.environ["NETREDUCE_RACK_SWITCH"] = "%s:%d" % racks[rank * len(racks) // size]
    with dataplane.connect(spine, job, rank, size, timeout=20.0) as conn:
        got = []
        for owner in range(size):
            src = np.full(count, float(rank + 1 + owner), np.float32)
            dst = np.full(count, -1.0, np.float32)
            conn.allreduce_async(src, dst, owner=owner).wait()
            want = sum(r + 1 + owner for r in range(size)) if owner == rank else -1.0
            got.append(bool((dst == want).all()))
        return got


def test_owner_delivery_through_the_tree(tree):
    spine, racks = tree()
    results = run_ranks(_owners, 4, spine.address, [r.address for r in racks], _job(), 100_003)
    assert all(all(r) for r in results), results


def _deterministic(rank, size, spine, racks, job):
    os.environ["NETREDUCE_RACK_SWITCH"] = "%s:%d" % racks[rank * len(racks) // size]
    os.environ["NETREDUCE_DETERMINISTIC"] = "1"
    return _first_error(spine, job, rank, size, timeout=5.0)


def test_deterministic_mode_is_refused_through_racks(tree):
    spine, racks = tree()
    for message in run_ranks(_deterministic, 4, spine.address, [r.address for r in racks],
                             _job(), timeout=60):
        assert "NETREDUCE_DETERMINISTIC=1 is not available through rack aggregators" in message, \
            message


@pytest.mark.slow
def test_killed_rack_aggregator_is_named_on_every_rank(tree, tmp_path):
    """Rack 1's daemon SIGKILLed mid-job: the spine sees its control connection close
    and fails the job's negotiation, so every rank's error names rack 1's aggregator,
    the ranks of rack 0 too (a timeout would name only their own path)."""
    spine, racks = tree()
    flag = str(tmp_path / "go")
    procs = _rack_ranks(spine, racks, _job(), "30", "kill", flag)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
                os.path.exists(f"{flag}.ready{r}") for r in range(4)):
            time.sleep(0.05)
        racks[1].proc.kill()
        racks[1].proc.wait()
        open(flag, "w").close()
    except BaseException:
        for p in procs:
            p.kill()
            p.wait()
        raise
    # every rank's report, whatever its exit after the error
    results = collect_ok(procs, timeout=120, any_exit=True)
    dead = "%s:%d" % racks[1].address
    for r in results:
        assert "failure" not in r, r
        assert f"rack aggregator {dead}" in r["error"] and "is gone" in r["error"], r
