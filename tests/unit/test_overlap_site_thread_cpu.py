"""benchmarks/overlap_site's per-thread CPU (overlap_step.py --thread-cpu): every
Python thread a rank starts carries its name at the kernel, each zero_grad takes a
snapshot of the threads' CPU and faults, and overlap_step.thread_cpu turns the ranks'
snapshots into CPU-seconds per step thread by thread."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from benchmarks import overlap_step  # noqa: E402

SITE = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "overlap_site")
SCRIPT = """
import threading, time
import torch
p = torch.nn.Parameter(torch.ones(3))
opt = torch.optim.SGD([p], lr=0.1)
stop = threading.Event()

def spin():
    while not stop.is_set():
        pass

t = threading.Thread(target=spin, name="netreduce-burner")
t.start()
for _ in range(3):
    opt.zero_grad()
    p.sum().backward()
    opt.step()
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
stop.set()
t.join()
"""


def test_each_thread_cpu_per_step_by_name(tmp_path):
    env = dict(os.environ, NRBENCH_THREAD_NAMES="1", RANK="2", NRBENCH_HVD="ddp:netreduce",
               NRBENCH_THREAD_CPU=str(tmp_path / "{who}.{rank}.json"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SITE, env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    path = tmp_path / "ddp_netreduce.2.json"
    snaps = json.loads(path.read_text())
    assert len(snaps) == 3  # one per zero_grad
    names = set(snaps[-1][1])
    assert {"MainThread", "netreduce-burne"} <= names, names  # (15 bytes at the kernel)
    per_step = overlap_step.thread_cpu([str(path), str(path)], 3)  # two "ranks", summed
    assert per_step["netreduce-burne"] > 0 and per_step["MainThread"] > 0, per_step
    assert overlap_step.thread_cpu([str(path), str(tmp_path / "missing.json")], 3) is None


def test_without_the_variables_nothing_is_named_or_written(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("NRBENCH_THREAD_NAMES", "NRBENCH_THREAD_CPU")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SITE, env.get("PYTHONPATH")) if p)
    code = ("import threading; t = threading.Thread(target=lambda: print(open("
            "'/proc/self/task/%d/comm' % threading.get_native_id()).read().strip()), "
            "name='netreduce-x'); t.start(); t.join()")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() != "netreduce-x"
    assert os.listdir(tmp_path) == []
