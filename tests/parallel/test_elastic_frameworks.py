"""The frameworks' elastic states at a changing size, under netreduce-run's elastic
driver: Keras (KerasState and the elastic callbacks around model.fit) and MXNet.
Hosts are added and removed by the discovery script (test_elastic_run.Run)."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from tests.parallel.test_elastic_run import Run
from tests.procs import ROOT

HERE = os.path.join(ROOT, "tests", "parallel")


def _epochs(run, worker):
    return [r for r in run.records().get(worker, []) if "epoch" in r]


@pytest.mark.slow  # ~60 s under load: TensorFlow starts in each worker
def test_keras_fit_through_a_host_added_and_removed(tmp_path):
    if importlib.util.find_spec("tensorflow") is None:  # (not imported: seconds, for the workers)
        pytest.skip("tensorflow is not importable")
    run = Run(tmp_path, ["localhost:1"], ["-np", "1", "--min-np", "1", "--max-np", "2"],
              command=[sys.executable, os.path.join(HERE, "tf_elastic_keras_worker.py")],
              ELASTIC_EPOCHS="8", ELASTIC_HOLD="2,5")
    run.wait_for(lambda: len(_epochs(run, "localhost_0")) >= 2, 120)
    run.set_hosts(["localhost:1", "127.0.0.1:1"])
    run.wait_for(lambda: _epochs(run, "127.0.0.1_0")[-1:] and
                 _epochs(run, "127.0.0.1_0")[-1]["epoch"] >= 5, 120)
    run.set_hosts(["localhost:1"])
    assert run.finish(180) == 0, run.output()
    first = _epochs(run, "localhost_0")
    second = _epochs(run, "127.0.0.1_0")
    assert [r["epoch"] for r in first] == list(range(1, 9)), first  # no epoch lost or run twice
    assert [r["size"] for r in first] == [1, 1, 2, 2, 2, 1, 1, 1], first
    for r in second:  # while both trained, they held the same weights, at lr x 2
        twin = [f for f in first if f["epoch"] == r["epoch"]]
        assert twin and twin[0]["w"] == r["w"] and r["lr"] == pytest.approx(0.02), (r, twin)
    assert first[-1]["lr"] == pytest.approx(0.01)


def test_mxnet_trainer_through_a_rank_killed_and_a_host_added(tmp_path):
    from tests.parallel.mxnet_env import mxnet_python
    python = mxnet_python()
    run = Run(tmp_path, ["localhost:1", "127.0.0.1:1"], ["-np", "2", "--min-np", "1", "--max-np", "2"],
              command=[python, os.path.join(HERE, "mxnet_elastic_worker.py")],
              ELASTIC_STEPS="40", OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1",
              # the added host's update announced at once, the job waiting for its worker
              # (horovodrun's way): started ahead, a slow MXNet start could miss all 22
              # steps left, and the job would end at size 1 before it joined
              NETREDUCE_ELASTIC_AHEAD="0")
    run.wait_for(lambda: run.steps().get("127.0.0.1_0", 0) >= 10, 120)
    run.kill_worker("127.0.0.1_0")
    run.wait_for(lambda: run.steps().get("localhost_0", 0) >= 18, 120)
    run.set_hosts(["localhost:1", "127.0.0.1:1", "127.0.0.2:1"])  # 127.0.0.1 is blacklisted
    assert run.finish(180) == 0, run.output()
    finals = run.finals()
    assert sorted(finals) == ["127.0.0.2_0", "localhost_0"], run.output()
    assert len({f["w"] for f in finals.values()}) == 1, "parameters differ"
    assert len({f["momentum"] for f in finals.values()}) == 1, "momentum differs"
    sizes = [r["size"] for r in run.records()["localhost_0"] if "size" in r and "step" in r]
    assert sizes[0] == 2 and 1 in sizes and sizes[-1] == 2, sizes
    assert "epoch 3: 2 rank(s) on localhost:1, 127.0.0.2:1 (was 1)" in run.output()
