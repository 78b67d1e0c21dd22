"""The benchmark scripts still run end to end (tiny sizes, loopback) and check what
they measure: a broken benchmark would otherwise be found only when numbers are
wanted. Numbers are not asserted here (timings belong in BENCHMARKS.md)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytest.importorskip("torch")


def _run(args, tmp_path, timeout=180):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable] + args, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_allreduce_benchmark_verifies_every_result(tmp_path):
    impls = ["netreduce", "gloo"]
    try:
        import mpi4py  # noqa: F401
        if shutil.which("mpirun"):
            impls.append("mpi")
    except ImportError:
        pass
    out = tmp_path / "ar.json"
    _run(["benchmarks/allreduce.py", "--np", "2", "--impls", ",".join(impls),
          "--min-size", "4K", "--max-size", "64K", "--factor", "16", "--target-bytes", "1M",
          "--min-iters", "2", "--max-iters", "4", "--json", str(out),
          "--md", str(tmp_path / "ar.md"), "--plot", str(tmp_path / "ar.png")], tmp_path)
    records = json.loads(out.read_text())["records"]
    assert sorted({r["impl"] for r in records}) == sorted(impls)
    assert {r["size"] for r in records} == {4096, 65536}
    assert all(r["correct"] for r in records), [r for r in records if not r["correct"]]
    assert (tmp_path / "ar.png").stat().st_size > 0
    assert "netreduce" in (tmp_path / "ar.md").read_text()


@pytest.mark.slow
def test_train_benchmark_runs_netreduce_modes(tmp_path):
    out = tmp_path / "train.md"
    proc = _run(["benchmarks/train.py", "--models", "resnet18", "--ranks", "2",
                 "--modes", "nr-hvd,nr-ddp", "--steps", "1", "--warmup", "1",
                 "--batch-size", "2", "--repeat", "1", "--out", str(out)], tmp_path)
    rows = [line for line in out.read_text().splitlines() if line.startswith("| resnet18 | 2 |")]
    assert len(rows) == 1, out.read_text()
    cells = [c.strip() for c in rows[0].strip("|").split("|")][2:]
    assert len(cells) == 2 and all(float(c.split()[0].strip("*")) > 0 for c in cells), rows
    assert "error" not in proc.stdout
