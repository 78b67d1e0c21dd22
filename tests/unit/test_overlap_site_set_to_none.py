"""benchmarks/overlap_site's NRBENCH_SET_TO_NONE=0: a script's optimizer.zero_grad()
zeroes the gradients in place (their memory kept from step to step) in every rank that
overlap_step.py starts with it; without it torch's default (set to None) stands."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

SITE = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "overlap_site")
SCRIPT = """
import torch
p = torch.nn.Parameter(torch.ones(3))
opt = torch.optim.SGD([p], lr=0.1)
p.sum().backward()
before = p.grad.data_ptr()
opt.zero_grad()
print("kept" if p.grad is not None and p.grad.data_ptr() == before
      and not p.grad.any() else "none" if p.grad is None else "other")
"""


@pytest.mark.parametrize("value, expected", [("0", "kept"), (None, "none")])
def test_zero_grad_in_place_when_asked(value, expected):
    env = {k: v for k, v in os.environ.items() if k != "NRBENCH_SET_TO_NONE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SITE, env.get("PYTHONPATH")) if p)
    if value is not None:
        env["NRBENCH_SET_TO_NONE"] = value
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == expected, out.stdout
