"""Where MXNet's test environment is (scripts/env_mxnet.sh builds it): one helper for
every test that starts MXNet ranks. mxnet 1.9.1 needs numpy < 1.24, so it lives in its
own venv and the main environment's tests start ranks with that venv's python."""
from __future__ import annotations

import functools
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("NETREDUCE_CACHE") or os.path.expanduser("~/.cache/netreduce")
VENV = os.path.join(CACHE, "venv-mxnet")
PYTHON = os.path.join(VENV, "bin", "python")


@functools.lru_cache(maxsize=None)
def _problem() -> str:
    """'' when the venv imports mxnet and netreduce.mxnet from this checkout."""
    if not os.access(PYTHON, os.X_OK):
        return f"no MXNet environment at {VENV}"
    probe = subprocess.run(
        [PYTHON, "-c", "import mxnet, netreduce.mxnet, netreduce; print(netreduce.__file__)"],
        capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        return f"{PYTHON} cannot import mxnet / netreduce.mxnet: {probe.stderr.strip()[-300:]}"
    where = os.path.dirname(os.path.dirname(os.path.realpath(probe.stdout.strip())))
    if where != os.path.realpath(ROOT):
        return f"{VENV} has netreduce from {where}, not this checkout {ROOT}"
    return ""


def mxnet_python() -> str:
    """The venv's python; skips the calling test with the reason when the venv is
    missing or stale — and fails it under CI=true, where install.sh test built it."""
    problem = _problem()
    if problem:
        message = f"{problem}: run `bash scripts/env_mxnet.sh` (part of scripts/install.sh test)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return PYTHON


def rank_env() -> dict:
    """Environment for MXNet ranks started from a test: one thread each (N ranks share
    the cores), no leftover launcher variables, this checkout first on the path."""
    env = dict(os.environ, NETREDUCE_TIMEOUT="20", OMP_NUM_THREADS="1",
               MXNET_CPU_WORKER_NTHREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    for var in ("NETREDUCE_SWITCH", "NETREDUCE_RANK", "NETREDUCE_SIZE", "NETREDUCE_JOB",
                "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env.pop(var, None)
    return env


def run_ranks_file(name: str, ranks: int, at_least: int, timeout: float) -> None:
    """tests/parallel/``name`` as a pytest session on every rank of a netreduce-run
    job of ``ranks`` ranks, with the venv's python (the launcher and aggregator are this
    environment's); fails unless the job succeeded and every rank passed at least
    ``at_least`` tests and skipped none (a skip would hide a rank that never ran them)."""
    python = mxnet_python()
    cmd = [sys.executable, "-m", "netreduce.launcher", "-np", str(ranks), "--", python, "-m",
           "pytest", "-q", "-x", "-p", "no:cacheprovider",
           os.path.join(ROOT, "tests", "parallel", name)]
    proc = subprocess.run(cmd, cwd=ROOT, env=rank_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-6000:]
    passed = [int(n) for n in re.findall(r"(\d+) passed", proc.stdout)]
    assert len(passed) == ranks and min(passed) >= at_least, proc.stdout[-3000:]
    assert "skipped" not in proc.stdout, proc.stdout[-3000:]
