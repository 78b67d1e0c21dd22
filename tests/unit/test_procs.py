"""tests/procs.py's collect_ok: a rank's report is its last line that starts with "{"
(whatever it prints after it), and the first rank that fails stops the collection at
once, named with its stderr, and the ranks still running (waiting on it) are killed
first rather than left behind."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.procs import collect_ok


def _rank(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_the_report_is_the_last_line_that_starts_with_a_brace():
    procs = [_rank('print("chatter"); print(\'{"rank": %d}\'); print("a warning at exit")' % r)
             for r in range(2)]
    assert collect_ok(procs, timeout=60) == [{"rank": 0}, {"rank": 1}]


def test_a_failed_rank_fails_at_once_and_the_others_are_killed():
    waiting = _rank("import time; time.sleep(120)")
    failing = _rank('import sys, time; time.sleep(0.3); sys.exit("rank 1 lost its aggregator")')
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match="rank 1 exited 1.*rank 1 lost its aggregator"):
        collect_ok([waiting, failing], timeout=60)
    assert time.monotonic() - t0 < 30  # not the timeout, nor the waiting rank's sleep
    assert waiting.poll() is not None  # killed, not left running


def test_a_rank_without_a_report_fails_naming_it():
    procs = [_rank('print(\'{"rank": 0}\')'), _rank('print("no report")')]
    with pytest.raises(AssertionError, match="rank 1 printed no JSON report"):
        collect_ok(procs, timeout=60)
