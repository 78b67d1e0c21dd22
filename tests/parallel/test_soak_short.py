"""The soak benchmark's short mode (benchmarks/soak.py): 3 ranks, 1 % loss by the
engine knob, one worker SIGKILLed and restarted mid-run (a second one at the end, when
no new run starts); the job re-forms and every result checked against numpy is exact.
The 10-minute figure is in BENCHMARKS.md."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_soak_short_mode_has_no_wrong_result(tmp_path):
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "soak.py"),
                           # the driver looks every 5 s: the kill at ~5 s, the last new
                           # run 5 s after it (END_MARGIN_S), as at 10 s of the 20 it ran
                           # before; a second kill at ~10 s is one more the job survives
                           "--seconds", "15", "--restart-every", "5", "-n", "3",
                           "--max-elems", "200000", "--out", str(out)],
                          capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rec = json.loads(out.read_text())
    assert rec["wrong"] == 0, rec
    assert rec["restarts"] >= 1, rec
    # every rank reduced (and checked) results, and the survivors rejoined after the kill
    assert min(rec["checked_per_rank"]) > 0, rec
    assert all(f >= 1 for i, f in enumerate(rec["failed_runs_per_rank"]) if i != 0), rec
