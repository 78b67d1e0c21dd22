"""init() again, and init() without an aggregator, ranks as threads on the fake
server and fabric (test_communicator.py: the values)."""
import numpy as np
import pytest

import netreduce as nr
from netreduce import api
from netreduce.worker import context


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
