"""Where MXNet's test environment is (scripts/env_mxnet.sh builds it): one helper for
every test that starts MXNet ranks. mxnet 1.9.1 needs numpy < 1.24, so it lives in its
own venv and the main environment's tests start ranks with that venv's python."""
from __future__ import annotations

import functools
import os
import subprocess

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
