"""Ray: Ray Train's TorchTrainer with netreduce.torch.ray_train.NetReduceConfig and
netreduce.launcher.ray_executor.RayExecutor, each with 2 CPU workers on a local Ray cluster the
driver (tests/parallel/ray_driver.py, its own process) starts and stops."""
import json
import os
import subprocess
import sys

import pytest

from netreduce.environment import discover

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _require_ray():
    try:
        import ray.train.torch  # noqa: F401
    except ImportError as exc:
        message = (f"ray[train] is not importable ({exc}): pip install 'ray[train]' "
                   "(scripts/install.sh test does)")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def driver_env() -> dict:
    """The driver's environment: this one without a launcher's or Ray client's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NETREDUCE_", "RAY_ADDRESS")) and k not in
           ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    # Ray Train's controller looks at its workers at most every 2 s (its default): the
    # trainer's end was seen up to 2 s late. 0.2 s: the same states, seen sooner.
    env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.2"
    return env


DRIVER = [sys.executable, os.path.join(HERE, "ray_driver.py")]


def _result(stdout: str):
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT "):]) if lines else None


@pytest.fixture(scope="module")
def driven():
    _require_ray()
    from tests import prebuild
    # the driver's background run, if one was started at the session's start
    # (tests/prebuild.py): its result where it succeeded, else the driver runs here
    # as without it
    if prebuild.wait(prebuild.RAY) == 0:
        result = _result(prebuild.output(prebuild.RAY))
        if result is not None:
            return result
    proc = subprocess.run(DRIVER, cwd=ROOT, env=driver_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    result = _result(proc.stdout)
    assert proc.returncode == 0 and result is not None, proc.stdout[-6000:]
    return result


pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(discover().size > 1, reason="already running under a launcher")]


def test_torch_trainer_trains_on_netreduce(driven):
    t = driven["trainer"]
    assert t["error"] is None
    assert [r["rank"] for r in t["ranks"]] == [0, 1]
    for r in t["ranks"]:
        assert r["backend"] == "netreduce"
        assert r["sum"] == 3 and r["hvd_avg"] == 0.5
        assert r["layout"] == [r["rank"], 2, r["rank"], 2]  # one node: both local
        assert r["losses"][-1] < r["losses"][0]
    assert t["ranks"][0]["weights"] == t["ranks"][1]["weights"]
    for got, want in zip(t["ranks"][0]["weights"], t["reference"]):
        assert got == pytest.approx(want, abs=1e-5)


def test_torch_trainer_stops_the_aggregator_rank_0_started(driven):
    t = driven["trainer"]
    assert t["ranks"][0]["aggregator_pid"] is not None
    assert not t["aggregator_left_running"]


def test_ray_executor_runs_a_job_twice_and_cleans_up(driven):
    e = driven["executor"]
    for results in (e["first"], e["again"]):
        assert [r["rank"] for r in results] == [0, 1]
        assert all(r["size"] == 2 and r["exact"] for r in results)
        assert [r["local"] for r in results] == [[0, 2], [1, 2]]
    assert not e["aggregator_left_running"]


def test_config_arguments_are_checked():
    _require_ray()
    from netreduce.errors import InvalidArgumentError
    from netreduce.launcher.ray_executor import RayExecutor, local_layout
    from netreduce.torch.ray_train import NetReduceConfig
    with pytest.raises(InvalidArgumentError, match="backend is 'netreduce'"):
        NetReduceConfig(backend="gloo")
    with pytest.raises(ValueError):
        NetReduceConfig(switch="host:notaport")
    with pytest.raises(InvalidArgumentError, match="at least one"):
        RayExecutor(num_workers=0)
    assert local_layout(["a", "b", "a", "a"]) == [(0, 3), (0, 1), (1, 3), (2, 3)]


if __name__ == "__main__":  # tests/prebuild.py's background run: the driver, as the fixture runs it
    os.execve(DRIVER[0], DRIVER, driver_env())
