"""scripts/sanitizers.sh in the suite: the native data plane built with ASan + UBSan
(fuzz/dataplane_selftest.cc against a real aggregator on loopback) and a bounded
fuzz smoke of the packet decoder, the aggregator's per-packet path and the control
port's parser (fuzz/README.md). Skipped, with the reason, where clang or atheris is
missing; under CI (CI=true) their absence is a failure."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests import prebuild

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _need(ok: bool, what: str) -> None:
    if ok:
        return
    msg = f"needs {what} (scripts/install.sh test installs it)"
    if CI:
        pytest.fail(f"CI must run the sanitizer build: {msg}", pytrace=False)
    pytest.skip(msg)


@pytest.mark.slow
def test_sanitizer_build_and_fuzz_smoke():
    _need(shutil.which("clang++") is not None, "clang (apt-get install clang libclang-rt-14-dev)")
    try:
        import atheris  # noqa: F401
        have_atheris = True
    except ImportError:
        have_atheris = False
    _need(have_atheris, "atheris (pip install atheris)")
    # 2 s of each fuzzer (libFuzzer stops ~1 s past it): every committed corpus input is
    # replayed first whatever the time, then ~1.7 M decoder, ~6 k aggregator and ~26 k
    # control-port mutations (12-06, quiet); 5 s added ~9 s of wall time to every CI run.
    # The long runs are FUZZ_SECONDS=60 by hand (fuzz/README.md).
    # the build, started in the background at the session's start (tests/prebuild.py);
    # sanitizers.sh's own fuzz/build.sh then finds it done, or builds what it lacks
    prebuild.wait(prebuild.FUZZ)
    env = dict(os.environ, FUZZ_SECONDS=os.environ.get("FUZZ_SECONDS", "2"), REQUIRE_ATHERIS="1")
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "sanitizers.sh")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "dataplane selftest passed" in out and "all clean" in out, out[-3000:]
    runs = [int(line.split()[-1]) for line in out.splitlines()
            if line.startswith("stat::number_of_executed_units")]
    assert len(runs) == 3 and all(r > 0 for r in runs), out[-3000:]
