"""The public API when a rank fails, stalls, shuts down or dies, or the aggregator
falls silent, ranks as threads on the fake server and fabric: every other rank's
error names what failed (test_communicator.py: the values)."""
import logging

import numpy as np
import pytest

import netreduce as nr
from netreduce.protocol import messages
from netreduce.worker import context
from netreduce.errors import RankFailedError, ShutdownError


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
