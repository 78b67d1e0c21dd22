"""The suite's own time bound (pyproject.toml, pytest-timeout): every test has one,
and a test that hangs fails with every thread's stack, naming itself."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_test_is_bounded_by_the_thread_method(request):
    assert float(request.config.getini("timeout")) > 0
    assert request.config.getini("timeout_method") == "thread"


def test_a_hang_fails_fast_with_every_threads_stack(tmp_path):
    (tmp_path / "test_hang.py").write_text(
        "import threading, time\n"
        "def test_hangs_in_a_wait():\n"
        "    threading.Thread(target=time.sleep, args=(60,), name='helper', daemon=True).start()\n"
        "    threading.Event().wait()  # a wait no signal interrupts\n")
    # The project's configuration (-c pyproject.toml), its bound shortened to 2 s.
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-c", os.path.join(ROOT, "pyproject.toml"), "--rootdir", str(tmp_path),
                          "-o", "timeout=2", str(tmp_path / "test_hang.py")],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert "Timeout" in text and "test_hangs_in_a_wait" in text, text
    assert "Stack of helper" in text, text  # every thread, not only the test's
