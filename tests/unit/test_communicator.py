"""The public API end to end, ranks as threads, on the fake server and fabric
(the same scenarios run as processes on the real data plane in tests/parallel)."""
import json
import logging
import random

import numpy as np
import pytest

import netreduce as nr
from netreduce import api
from netreduce.protocol import messages
from netreduce.worker import context
from netreduce.errors import NegotiationError, RankFailedError, ShutdownError


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_rank_r_contributes_r(ranks, size):
    def fn(r):
        out = [nr.allreduce(np.full(n, r, np.float32), op=nr.Sum, name=f"t{n}")
               for n in (0, 1, 1000, 70000)]
        avg = nr.allreduce(np.full(7, r, np.float64))
        return out, avg
    for out, avg in ranks(size).run(fn):
        for a in out:
            assert (a == size * (size - 1) / 2).all()
        assert np.allclose(avg, (size - 1) / 2)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "int64", "int8",
                                   "uint8"])
def test_random_data_against_numpy(ranks, dtype):
    size = 3
    data = [np.random.default_rng(r).integers(-20, 20, (5, 33)).astype(dtype)
            for r in range(size)]

    def fn(r):
        return (nr.allreduce(data[r], op=nr.Sum, name="s"),
                nr.allreduce(data[r], op=nr.Min, name="mn"),
                nr.allreduce(data[r], op=nr.Max, name="mx"))
    for s, mn, mx in ranks(size).run(fn):
        np.testing.assert_array_equal(s, np.sum(data, axis=0).astype(dtype))
        np.testing.assert_array_equal(mn, np.min(data, axis=0))
        np.testing.assert_array_equal(mx, np.max(data, axis=0))
        assert s.dtype == np.dtype(dtype)


def test_bfloat16_through_uint16(ranks):
    vals = np.array([1.0, 2.0, -0.5], np.float32)
    bits = (vals.view(np.uint32) >> 16).astype(np.uint16)

    def fn(r):
        return nr.allreduce(bits, op=nr.Average, name="bf", dtype="bfloat16")
    for out in ranks(2).run(fn):
        assert ((out.astype(np.uint32) << 16).view(np.float32) == vals).all()


def test_fifty_tensors_in_a_different_random_order_per_rank(ranks):
    size = 4
    shapes = {f"g{i}": (i % 7 + 1, 3) for i in range(50)}

    def fn(r):
        names = list(shapes)
        random.Random(r).shuffle(names)
        handles = {n: nr.allreduce_async(np.full(shapes[n], r + int(n[1:]), np.float32),
                                         op=nr.Sum, name=n) for n in names}
        return {n: nr.synchronize(h) for n, h in handles.items()}
    R = ranks(size)
    for got in R.run(fn):
        for n, arr in got.items():
            assert (arr == sum(r + int(n[1:]) for r in range(size))).all(), n


def test_prescale_postscale_average(ranks):
    def fn(r):
        a = nr.allreduce(np.full(4, r + 1, np.float32), name="a", prescale_factor=2.0,
                         postscale_factor=0.5)
        b = nr.allreduce(np.full(4, r + 1, np.int32), op=nr.Sum, name="b", prescale_factor=0.5)
        g = nr.grouped_allreduce([np.ones(3, np.float32) * r, np.ones(5, np.float32)], op=nr.Sum,
                                 name="g", postscale_factor=10.0)
        return a, b, g
    for a, b, g in ranks(2).run(fn):
        assert (a == 1.5).all()            # ((1+2)*2/2)*0.5 = 1.5
        assert (b == 0 + 1).all()          # int(1*0.5)=0, int(2*0.5)=1
        assert (g[0] == 10).all() and (g[1] == 20).all()


def test_in_place_and_broadcast_and_objects(ranks):
    def fn(r):
        x = np.full(6, r, np.float32)
        y = nr.allreduce_(x, op=nr.Sum, name="x")
        b = nr.broadcast(np.arange(5) * (r + 1), root_rank=1, name="b")
        c = np.full(3, r, np.float64)
        nr.broadcast_(c, root_rank=2)
        obj = nr.broadcast_object({"from": r}, root_rank=1)
        everyone = nr.allgather_object(("r", r, "x" * r))
        nr.barrier()
        return y is x, x, b, c, obj, everyone
    for same, x, b, c, obj, everyone in ranks(3).run(fn):
        assert same and (x == 3).all()
        assert (b == np.arange(5) * 2).all() and (c == 2).all()
        assert obj == {"from": 1}
        assert everyone == [("r", r, "x" * r) for r in range(3)]


def test_mismatched_shapes_fail_on_every_rank(ranks):
    def fn(r):
        with pytest.raises(NegotiationError) as info:
            nr.allreduce(np.zeros((2, 3) if r == 0 else (3,), np.float32), name="bad")
        # the communicator keeps working afterwards
        return str(info.value), nr.allreduce(np.ones(2, np.float32), op=nr.Sum, name="ok")
    for msg, ok in ranks(2).run(fn):
        assert "Mismatched allreduce tensor shapes: One rank sent a tensor of shape [2, 3], " \
               "but another rank sent a tensor of shape [3]" in msg
        assert "'bad'" in msg and "rank 0" in msg and "rank 1" in msg
        assert (ok == 2).all()


def test_mismatched_dtype_and_op(ranks):
    def fn(r):
        with pytest.raises(nr.NetReduceError, match="Mismatched data types"):
            nr.allreduce(np.zeros(3, np.float32 if r else np.float64), name="d")
        with pytest.raises(nr.NetReduceError, match="Mismatched allreduce reduction ops"):
            nr.allreduce(np.zeros(3), op=nr.Sum if r else nr.Max, name="o")
    ranks(2).run(fn)


def test_duplicate_in_flight_name_is_a_value_error(ranks):
    def fn(r):
        h = nr.allreduce_async(np.ones(3, np.float32), name="dup")
        with pytest.raises(ValueError, match="'dup' is already being reduced"):
            nr.allreduce_async(np.ones(3, np.float32), name="dup")
        nr.synchronize(h)
        nr.synchronize(nr.allreduce_async(np.ones(3, np.float32), name="dup"))  # fine now
        with pytest.raises(ValueError, match="already being reduced"):
            nr.grouped_allreduce_async([np.ones(1)], name="same") and \
                nr.grouped_allreduce_async([np.ones(1), np.ones(1)], name="same")
    ranks(1).run(fn)


def test_bad_arguments(ranks):
    def fn(r):
        with pytest.raises(ValueError, match="C-contiguous"):
            nr.allreduce(np.zeros((3, 3), np.float32).T, name="t")
        with pytest.raises(NotImplementedError):
            nr.allreduce(np.zeros(3), op=nr.ReduceOp.Adasum)
        with pytest.raises(ValueError, match="root_rank 5"):
            nr.broadcast(np.zeros(3), root_rank=5)
        with pytest.raises(TypeError, match="cannot all-reduce dtype"):
            nr.allreduce(np.zeros(3, np.complex64))
    ranks(1).run(fn)


def test_not_initialized():
    assert not nr.is_initialized()
    with pytest.raises(nr.NetReduceError, match="not been initialized"):
        nr.allreduce(np.zeros(1))
    with pytest.raises(nr.NetReduceError, match="not been initialized"):
        nr.rank()


def test_stall_warning_names_missing_ranks(ranks, caplog):
    import threading
    warned = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record):
            if "'only-rank-0'" in record.getMessage():
                warned.set()

    def fn(r):
        if r == 0:
            return nr.allreduce_async(np.ones(2, np.float32), name="only-rank-0")
        # Ranks 1 and 2 stay away until rank 0 has warned (or 30 s), then submit it too:
        # the op completes, so shutdown() need not wait NETREDUCE_TIMEOUT for it (it did,
        # 3 s of this test's 3.8), and a warning that never comes still fails below.
        warned.wait(30)
        return nr.allreduce(np.ones(2, np.float32), name="only-rank-0")
    R = ranks(3, NETREDUCE_STALL_TIMEOUT=0.2, NETREDUCE_TIMEOUT=3.0)
    seen = Seen()
    logging.getLogger("netreduce").addHandler(seen)
    try:
        with caplog.at_level(logging.WARNING, logger="netreduce"):
            R.run(fn, shutdown=False)
    finally:
        logging.getLogger("netreduce").removeHandler(seen)
    text = caplog.text
    assert "'only-rank-0'" in text and "rank(s) 1, 2" in text
    for c in R.comms:
        c.shutdown()


def test_rank_shutdown_fails_others_naming_it(ranks):
    import threading
    gate = threading.Event()

    def fn(r):
        nr.allreduce(np.ones(2, np.float32), name="warmup")
        if r == 1:
            context.thread.comm.shutdown()
            gate.set()
            return None
        h = nr.allreduce_async(np.ones(2, np.float32), name="needs-rank-1")
        gate.wait(5)
        with pytest.raises(RankFailedError, match="rank 1 called shutdown") as info:
            nr.synchronize(h)
        assert info.value.rank == 1
        with pytest.raises(RankFailedError, match="rank 1"):
            nr.allreduce(np.ones(2, np.float32), name="later")
        return True
    R = ranks(3)
    R.run(fn, shutdown=False)
    for r in (0, 2):
        R.comms[r].shutdown()


def test_rank_shutdown_is_an_error_only_for_an_operation_that_needs_it(ranks, caplog):
    """As under Horovod: a rank that called shutdown() fails the others' next
    collective, with an error that names the departed rank, the operation, the job and
    the aggregator; a rank with nothing pending is told nothing false (the report is
    no claim that it had operations needing rank 1), raises nothing, logs nothing and
    shuts down cleanly."""
    import threading
    import time
    from netreduce.protocol.address import format_address
    left = threading.Event()
    R = ranks(3)
    aggregator = format_address(R.server.address)

    def fn(r):
        nr.allreduce(np.ones(2, np.float32), name="warmup")
        comm = context.thread.comm
        if r == 1:
            comm.shutdown()
            left.set()
            return None
        assert left.wait(10)
        deadline = time.monotonic() + 10
        while comm.failure() is None and time.monotonic() < deadline:
            time.sleep(0.01)                 # idle here when the report comes
        report = str(comm.failure())
        assert "rank 1 called shutdown()" in report and "still had operations" not in report, \
            report
        if r == 2:
            return "idle"                    # then shuts down (below): no error
        with pytest.raises(RankFailedError) as info:
            nr.allreduce(np.ones(2, np.float32), name="later")
        text = str(info.value)
        assert info.value.rank == 1, text
        for part in ("rank 0 of job 'job'", "tensor 'later'", "rank 1 called shutdown()",
                     f"aggregator {aggregator}"):
            assert part in text, (part, text)
        assert "still had operations" not in text, text
        return "told"
    with caplog.at_level(logging.INFO, logger="netreduce"):
        assert R.run(fn, shutdown=False) == ["told", None, "idle"]
        for r in (0, 2):
            R.comms[r].shutdown()
    noise = [rec.getMessage() for rec in caplog.records
             if rec.name.startswith("netreduce") and rec.levelno >= logging.WARNING]
    assert not noise, noise


def test_rank_death_fails_others_naming_it(ranks):
    def fn(r):
        nr.allreduce(np.ones(2, np.float32), name="warmup")
        if r == 1:
            # what a killed process leaves behind: its connections close, nothing else
            context.thread.comm.neg.close()
            return None
        with pytest.raises(RankFailedError, match="rank 1 disconnected"):
            nr.allreduce(np.ones(2, np.float32), name="needs-rank-1")
        return True
    R = ranks(2)
    R.run(fn, shutdown=False)
    R.comms[0].shutdown()


def test_pending_ops_fail_on_own_shutdown(ranks):
    import threading
    # Both ranks shut down at once. Whichever says goodbye first must not reach the
    # other before that one has begun its own shutdown, or the other's pending
    # tensor rightly fails as "rank N called shutdown()" instead: hold each bye
    # until both ranks are inside shutdown().
    both_stopping = threading.Barrier(2)

    def fn(r):
        h = nr.allreduce_async(np.ones(2, np.float32), name=f"never-{r}")
        comm = context.thread.comm
        bye = comm.neg.bye

        def bye_once_both_stop(*args, **kwargs):
            both_stopping.wait(10)
            return bye(*args, **kwargs)
        comm.neg.bye = bye_once_both_stop
        comm.shutdown()
        with pytest.raises(ShutdownError, match=f"rank {r} before every rank of job 'job' "
                                                f"submitted tensor 'never-{r}'"):
            nr.synchronize(h)
        with pytest.raises(ShutdownError, match=f"rank {r} of job 'job' \\(tensor 'after' "
                                                "not submitted\\).*init\\(\\) on every rank"):
            nr.allreduce(np.ones(2, np.float32), name="after")
    ranks(2).run(fn, shutdown=False)


def test_wait_timeout_is_a_netreduce_error_naming_the_tensors(ranks):
    import threading
    from netreduce.errors import OperationTimeoutError
    gate = threading.Event()

    def fn(r):
        if r == 1:
            gate.wait(10)  # rank 0 waits in vain first
        h = nr.grouped_allreduce_async([np.ones(2, np.float32)] * 2, op=nr.Sum, name="late")
        if r == 0:
            with pytest.raises(OperationTimeoutError,
                               match=r"tensors 'late\.0', 'late\.1' still in flight") as info:
                h.wait(0.05)
            assert isinstance(info.value, TimeoutError)  # `except TimeoutError` still works
            assert isinstance(info.value, nr.NetReduceError)
            gate.set()
        return [a.tolist() for a in h.wait(10)]  # the operation went on
    assert ranks(2).run(fn) == [[[2.0, 2.0]] * 2] * 2


def test_data_plane_error_names_the_tensors_and_keeps_where(ranks, monkeypatch):
    from netreduce.errors import DataPlaneError
    from tests.unit.fakes import FakeConn

    def fails(self, src, dst=None, op="sum", dtype=None, scale=1.0):
        raise DataPlaneError("aggregator 10.0.0.9:4791, job 'job', rank 0/1: no result from "
                             "the aggregator within 1 s at slot 3")
    monkeypatch.setattr(FakeConn, "allreduce", fails)

    def fn(r):
        with pytest.raises(DataPlaneError) as info:
            nr.grouped_allreduce([np.ones(2, np.float32), np.ones(3, np.float32)], name="w")
        msg = str(info.value)
        assert "rank 0: reducing tensors 'w.0', 'w.1' failed: aggregator 10.0.0.9:4791, " \
               "job 'job', rank 0/1: no result from the aggregator within 1 s at slot 3" == msg
    ranks(1).run(fn)


def _in_new_run(R, fabric, r, fn):
    """Rank r of R calls shutdown() then starts again (what netreduce.init() does),
    and runs fn on the new communicator; returns (communicator, fn's result)."""
    from netreduce.worker.communicator import Communicator
    R.comms[r].shutdown()
    comm = Communicator(rank=r, size=R.size, job=R.job, address=R.server.address,
                        dataplane=fabric.connect(None, R.job, r, R.size), knobs=R.knobs)
    context.thread.comm = comm
    try:
        return comm, fn()
    finally:
        context.thread.comm = None


def test_init_again_while_another_rank_is_still_in_the_first_run(ranks):
    import threading
    import time
    from netreduce.switch import coordinator as coord
    from tests.unit.fakes import FakeFabric
    R = ranks(2)
    R.run(lambda r: nr.allreduce(np.ones(2, np.float32), name="first"), shutdown=False)
    fabric, out = FakeFabric(), [None, None]  # the new run's data plane

    def back(r):
        out[r] = _in_new_run(R, fabric, r, lambda: nr.allreduce(
            np.full(2, r + 1, np.float32), op=nr.Sum, name="first"))

    t0 = threading.Thread(target=back, args=(0,))
    t0.start()
    deadline = time.monotonic() + 10
    while coord._jobs(R.server)["job"].previous is None and time.monotonic() < deadline:
        time.sleep(0.01)  # until rank 0's hello has started the job's next run
    assert coord._jobs(R.server)["job"].previous is not None
    back(1)  # rank 1 was still in the first run until now
    t0.join(10)
    assert [o[1].tolist() for o in out] == [[3.0, 3.0]] * 2
    for comm, _ in out:
        comm.shutdown()


def test_init_again_names_the_rank_that_never_left(ranks):
    from netreduce.errors import ControlPlaneError
    from tests.unit.fakes import FakeFabric
    R = ranks(2, NETREDUCE_START_TIMEOUT=0.5)
    R.run(lambda r: None, shutdown=False)
    with pytest.raises(ControlPlaneError, match="rank 1 never left the job's previous run: a "
                                                "job restarts only once every rank has called "
                                                r"shutdown\(\) and then init\(\)"):
        _in_new_run(R, FakeFabric(), 0, lambda: None)
    R.comms[1].shutdown()


def test_fusion_buffer_allocated_once_and_cache_makes_steps_cheap(ranks):
    shapes = [(64, 3, 3), (64,), (128, 64), (128,), (10, 128), (10,)]

    def fn(r):
        comm = context.thread.comm
        for step in range(6):
            if step == 1:
                first = comm.neg.requests
            handles = [nr.allreduce_async(np.full(s, r, np.float32), op=nr.Sum, name=f"p{i}")
                       for i, s in enumerate(shapes)]
            for h in handles:
                nr.synchronize(h)
        return (comm.fusion.allocations, comm.cache.hits, comm.groups_executed,
                (comm.neg.requests - first) / 5)
    R = ranks(2, NETREDUCE_CYCLE_TIME=20)
    for allocations, hits, groups, requests_per_step in R.run(fn):
        assert allocations == 1
        assert hits >= 5 * len(shapes)           # after step 0 every name is an id
        assert groups <= 6 * 2                   # ≤ 2 fused messages per step, not 6
        # One small negotiation message per step, not one per tensor (6). A loaded
        # machine can split a step's submissions over two cycles, or expire a long
        # poll while the other rank is descheduled: at most one extra message.
        assert requests_per_step <= 2
    sizes = {c[2] for c in R.fabric.calls}
    assert sum(int(np.prod(s)) for s in shapes) in sizes  # one fused message per step


def test_timeline_has_every_phase(ranks, tmp_path):
    path = tmp_path / "trace.json"

    def fn(r):
        for step in range(2):
            nr.grouped_allreduce([np.ones(10, np.float32), np.ones(3, np.float32)], name="g")
    ranks(2, NETREDUCE_TIMELINE=str(path)).run(fn)
    events = json.loads(path.read_text())
    phases = {e["name"] for e in events if e["ph"] == "X"}
    # step 0 through the coordinator, step 1 agreed by the ranks' rounds (cached)
    assert phases == {"negotiate", "wait_for_ranks", "queued", "round", "copy_in", "allreduce",
                      "copy_out"}
    rows = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert rows == {"g.0", "g.1", "(agreement rounds)"}
    assert all(e["dur"] >= 0 and e["pid"] == 0 for e in events if e["ph"] == "X")


def test_single_process_init_spawns_an_embedded_aggregator(monkeypatch):
    from tests.unit.fakes import FakeFabric, FakeSwitchProcess
    spawned = []

    def spawn(*args, **opts):
        spawned.append(FakeSwitchProcess())
        return spawned[-1]
    fabric = FakeFabric()
    monkeypatch.setattr(api, "_spawn_switch", spawn)
    monkeypatch.setattr(api, "_connect", fabric.connect)
    for var in ("NETREDUCE_SWITCH", "NETREDUCE_RANK", "NETREDUCE_SIZE", "OMPI_COMM_WORLD_RANK",
                "RANK", "PMI_RANK", "HOROVOD_RANK", "SLURM_STEP_ID"):
        monkeypatch.delenv(var, raising=False)
    nr.init()
    try:
        nr.init()  # idempotent
        assert nr.is_initialized() and (nr.rank(), nr.size()) == (0, 1)
        assert (nr.local_rank(), nr.local_size()) == (0, 1)
        assert (nr.allreduce(np.arange(4.0)) == np.arange(4.0)).all()
    finally:
        nr.shutdown()
    assert not nr.is_initialized() and len(spawned) == 1 and spawned[0].stopped


def test_multi_rank_without_switch_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("NETREDUCE_SWITCH", raising=False)
    monkeypatch.setenv("NETREDUCE_RANK", "0")
    monkeypatch.setenv("NETREDUCE_SIZE", "2")
    with pytest.raises(nr.NetReduceError, match="NETREDUCE_SWITCH=H:P"):
        nr.init()


def test_silent_aggregator_fails_within_the_timeout(ranks, monkeypatch):
    import threading
    import time
    from netreduce.switch import coordinator as coord
    from netreduce.errors import ControlPlaneError
    release = threading.Event()
    R = ranks(1, NETREDUCE_TIMEOUT=0.5)

    def fn(r):
        nr.allreduce(np.ones(2, np.float32), name="fine")
        # from now on the aggregator accepts requests and never answers them
        for cmd in (messages.Negotiate, messages.NegotiateSubmit):
            monkeypatch.setitem(coord.HANDLERS, cmd,
                                lambda *a, real=coord.HANDLERS[cmd]: release.wait(30) and real(*a))
        t0 = time.monotonic()
        with pytest.raises(ControlPlaneError,
                           match=r"aggregator at 127\.0\.0\.1:\d+ did not answer"):
            nr.allreduce(np.ones(2, np.float32), name="hangs")
        assert time.monotonic() - t0 < 5
    try:
        R.run(fn)
    finally:
        release.set()


def test_last_barrier_survives_a_fast_peer_shutdown(ranks, monkeypatch):
    """Rank 0 finishes the final barrier and shuts down at once; rank 1 hears of the
    departure (watch) before it reads the barrier's log entry. The barrier must still
    complete on rank 1: rank 0 executed it."""
    import time
    from netreduce.worker.communicator import Communicator
    real = Communicator._on_reply

    def late_reply(self, reply):
        if self.rank == 1 and reply.entries:
            time.sleep(0.3)  # let the watch deliver rank 0's departure first
        return real(self, reply)
    monkeypatch.setattr(Communicator, "_on_reply", late_reply)

    def fn(r):
        nr.allreduce(np.ones(2, np.float32), name="last-step")
        nr.barrier()
        if r == 0:
            context.thread.comm.shutdown()
        return True
    R = ranks(2)
    assert R.run(fn, shutdown=False) == [True, True]
    R.comms[1].shutdown()


def test_in_flight_transfer_is_aborted_when_a_peer_dies(ranks, monkeypatch):
    from netreduce.errors import DataPlaneError
    from tests.unit.fakes import FakeConn
    real = FakeConn.allreduce

    def dies_instead(self, src, dst=None, op="sum", dtype=None, scale=1.0):
        # the second all-reduce of data (agreement rounds are int32 MIN messages)
        data_calls = getattr(self, "data_calls", 0)
        if src.dtype == np.float32:
            self.data_calls = data_calls + 1
        if self.rank == 1 and src.dtype == np.float32 and data_calls == 1:
            self.fabric.comm_of_rank1.neg.close()  # "dies" mid-transfer: sockets close
            import time
            time.sleep(2.0)  # a dead process never contributes
            raise DataPlaneError("rank 1 is dead")
        return real(self, src, dst, op, dtype, scale)
    monkeypatch.setattr(FakeConn, "allreduce", dies_instead)

    def fn(r):
        if r == 1:
            R.fabric.comm_of_rank1 = context.thread.comm
        nr.allreduce(np.ones(2, np.float32), name="warmup")
        if r == 1:
            nr.allreduce_async(np.ones(2, np.float32), name="transfer")
            import time
            time.sleep(1.0)
            return None
        with pytest.raises(RankFailedError, match="rank 1 disconnected") as info:
            nr.allreduce(np.ones(2, np.float32), name="transfer")
        assert info.value.rank == 1
        return True
    R = ranks(2, NETREDUCE_TIMEOUT=30)
    import time
    t0 = time.monotonic()
    R.run(fn, shutdown=False)
    assert time.monotonic() - t0 < 10  # aborted, not left to the 30 s data-plane timeout
    R.comms[0].shutdown()


# --- join (Horovod's uneven inputs) ------------------------------------------------------
@pytest.mark.parametrize("size", [1, 2, 3])
def test_join_with_uneven_steps(ranks, size):
    """Rank r runs r+1 steps then joins: a joined rank contributes zeros to the others'
    all-reduces (plain, grouped, fused async), Average still divides by size()."""
    def fn(r):
        got = []
        for step in range(r + 1):
            live = [q for q in range(size) if q >= step]
            s = nr.allreduce(np.full((2, 3), r + 1, np.float32), op=nr.Sum, name="s")
            a = nr.allreduce(np.full(4, r + 1, np.float64), name="avg")
            g = nr.grouped_allreduce([np.full(5, r + 1, np.int32), np.full(2, 1, np.int8)],
                                     op=nr.Sum, name="g")
            hs = [nr.allreduce_async(np.full(3, r + 1, np.float16), op=nr.Sum, name=f"f{i}")
                  for i in range(3)]
            fs = [nr.synchronize(h) for h in hs]
            want = sum(q + 1 for q in live)
            got.append(((s == want).all(), np.allclose(a, want / size), (g[0] == want).all(),
                        (g[1] == len(live)).all(), all((f == want).all() for f in fs)))
        last = nr.join()
        again = nr.allreduce(np.ones(2, np.float32), op=nr.Sum, name="after")
        return got, last, again
    for got, last, again in ranks(size).run(fn):
        assert all(all(step) for step in got), got
        assert last == size - 1
        assert (again == size).all()


def test_join_twice_and_barrier_and_bfloat16(ranks):
    bits = (np.array([1.0, -2.0], np.float32).view(np.uint32) >> 16).astype(np.uint16)

    def fn(r):
        lasts = []
        for epoch in range(2):
            joiner = epoch  # rank 0 joins first in epoch 0, rank 1 in epoch 1
            if r == joiner:
                lasts.append(nr.join())
                continue
            out = nr.allreduce(bits, op=nr.Sum, name="bf", dtype="bfloat16")
            assert ((out.astype(np.uint32) << 16).view(np.float32) == [1.0, -2.0]).all()
            nr.barrier()
            lasts.append(nr.join())
        return lasts
    assert ranks(2).run(fn) == [[1, 0], [1, 0]]


def test_broadcast_and_allgather_while_joined_raise(ranks):
    def fn(r):
        if r == 0:
            last = nr.join()
        else:
            with pytest.raises(NegotiationError, match="Broadcast is not supported with Join"):
                nr.broadcast(np.ones(3, np.float32), root_rank=1)
            with pytest.raises(NegotiationError, match="Allgather is not supported with Join"):
                nr.allgather_object(r)
            # still usable: the all-reduce goes on with rank 0's zeros
            ok = nr.allreduce(np.ones(2, np.float32), op=nr.Sum)
            assert (ok == 2).all()
            oks = nr.grouped_allreduce([np.ones(2, np.float32)] * 2, op=nr.Sum)
            assert all((o == 2).all() for o in oks)
            last = nr.join()
        # unnamed calls still pair up: the joined rank kept its auto-name counters in step
        assert nr.allgather_object(r) == [0, 1, 2]
        assert (nr.allreduce(np.ones(2, np.float32), op=nr.Sum) == 3).all()
        assert (nr.broadcast(np.full(2, r, np.float32), root_rank=2) == 2).all()
        return last
    lasts = ranks(3).run(fn)
    assert len(set(lasts)) == 1 and lasts[0] in (1, 2)  # whichever of 1, 2 joined last
