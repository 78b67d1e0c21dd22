"""Horovod's own elastic example, pytorch_synthetic_benchmark_elastic.py (tests/parallel/data),
with its one import changed to ``import netreduce.torch as hvd`` (and, first, the test's
torchvision shim), under netreduce-run with
horovodrun's elastic flags: it trains through a host added and the same host removed
by the discovery script, and rank 0 reports the job's throughput at the end."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time

import pytest

from tests.procs import ROOT

# Iterations of one batch: ~0.13 s each on a quiet host. Discovery runs every second and
# a change takes effect at the next commit, so the job must outlast a second after each
# change the test makes (after Iter #1, and two iterations into epoch 2): with 10, a
# quiet host finished before the removal was seen.
ITERS = 30
EXAMPLE = os.path.join(ROOT, "tests", "parallel", "data", "pytorch_synthetic_benchmark_elastic.py")
# torchvision 0.28's Linux wheel is the CUDA build, whose compiled ops do not load
# beside the CPU torch: its import then fails on two op schemas it registers fake
# kernels for. The models need none of the ops; declaring the schemas first lets it
# import (shared/research/torchvision.md). Only used when the plain import fails.
# A module the example imports first, not a sitecustomize.py on PYTHONPATH: that ran in
# every Python process of the job, so netreduce-run and its aggregator each imported
# torch and torchvision (~2.8 CPU-s each) before the workers could start.
TORCHVISION_CPU = '''
try:
    import torchvision  # noqa: F401
except RuntimeError:
    import sys
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    import torch
    _lib = torch.library.Library("torchvision", "FRAGMENT")
    _lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _lib.define("qnms(Tensor qdets, Tensor qscores, float iou_threshold) -> Tensor")
'''


def _torchvision_models(tmp_path) -> str:
    """The line that, first in a script in ``tmp_path``, makes ``from torchvision import
    models`` work there, or skip where torchvision is not installed. (Not probed by
    importing it: that is torch's and torchvision's start-up again, seconds; an installed
    torchvision that fails to import fails the test, in the workers' output.)"""
    if importlib.util.find_spec("torchvision") is None:
        pytest.skip("torchvision is not installed (scripts/install.sh test installs 0.28.0)")
    (tmp_path / "shim_torchvision.py").write_text(TORCHVISION_CPU)
    return "import shim_torchvision  # noqa: F401  (the test's: torchvision beside the CPU torch)\n"


def test_horovods_elastic_pytorch_example_through_a_host_added_and_removed(tmp_path):
    first_line = _torchvision_models(tmp_path)
    source = open(EXAMPLE).read()
    assert source.count("import horovod.torch as hvd") == 1
    example = tmp_path / "example.py"  # beside shim_torchvision.py: its folder is sys.path[0]
    example.write_text(first_line +
                       source.replace("import horovod.torch as hvd", "import netreduce.torch as hvd"))
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    # The driver announces the added host at once and the job waits for its worker at the
    # next commit, as horovodrun does: else the short example could end before it is up.
    env = dict(os.environ, OMP_NUM_THREADS="1", NETREDUCE_ELASTIC_AHEAD="0",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    log = open(tmp_path / "out.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "netreduce.launcher", "-np", "2", "--min-np", "1", "--max-np", "3",
         "--host-discovery-script", str(discover), sys.executable, str(example),
         "--model", "squeezenet1_1", "--batch-size", "2", "--num-warmup-batches", "1",
         "--num-batches-per-iter", "1", "--num-iters", str(ITERS), "--no-cuda"],
        cwd=str(tmp_path), env=env, stdout=log, stderr=subprocess.STDOUT)

    def output() -> str:
        log.flush()
        log.seek(0)
        return log.read()

    def wait_for(text: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in output():
            assert proc.poll() is None, output()
            assert time.monotonic() < deadline, f"no {text!r} within {timeout} s:\n{output()}"
            time.sleep(0.2)
    try:
        wait_for("Iter #1:")
        hosts.write_text("localhost:1\n127.0.0.1:1\n127.0.0.2:1\n")
        wait_for("epoch 2: 3 rank(s)")
        # three ranks have trained together once rank 0 reports two more iterations
        mark = output().count("Iter #")
        deadline = time.monotonic() + 120
        while output().count("Iter #") < mark + 2:
            assert proc.poll() is None and time.monotonic() < deadline, output()
            time.sleep(0.2)
        hosts.write_text("localhost:1\n127.0.0.1:1\n")
        assert proc.wait(240) == 0, output()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = output()
    assert "epoch 3: 2 rank(s) on localhost:1, 127.0.0.1:1 (was 3)" in out, out
    assert f"Iter #{ITERS - 1}:" in out, out
    assert "Total img/sec on 2 CPU(s)" in out, out
