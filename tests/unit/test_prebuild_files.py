"""tests/prebuild.py at the session's end: the files a background run made for its test
(the Soft-RoCE run's record folder) go with the run where no test read its output (the
session was interrupted, the test deselected), whether the run had finished or was
still running; where a test read it, they are that test's. Each test drives a
prebuild module of its own (its runs are not the session's) with one background run
of RUN."""
from __future__ import annotations

import importlib.util
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from tests import prebuild as session_prebuild

# The background run: a folder under PARENT named as prebuild asks (files_line), a
# file in it, then SECONDS of sleep; with OUTSIDE, that path is named too.
RUN = textwrap.dedent("""
    import os, sys, tempfile, time
    from tests.prebuild import files_line
    parent, seconds, outside = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    folder = tempfile.mkdtemp(prefix="run-", dir=parent)
    print(files_line(folder), flush=True)
    open(os.path.join(folder, "record.json"), "w").close()
    for path in outside:
        print(files_line(path), flush=True)
    time.sleep(seconds)
""")


def _started(monkeypatch, parent: Path, seconds: float, *outside: str):
    spec = importlib.util.spec_from_file_location("prebuild_under_test",
                                                  session_prebuild.__file__)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "compile_bytecode", lambda: None)
    monkeypatch.setattr(mod, "BUILDS", {"run": (sys.executable, lambda ids: True, [
        sys.executable, "-c", RUN, str(parent), str(seconds), *outside])})
    monkeypatch.delenv("NETREDUCE_TEST_PREBUILD", raising=False)
    mod.start({"tests/any.py::test_any"})
    return mod


def _folder(parent: Path, within: float = 60) -> Path:
    deadline = time.monotonic() + within
    while not list(parent.glob("run-*/record.json")):
        assert time.monotonic() < deadline, "the background run made no folder"
        time.sleep(0.02)
    [folder] = parent.glob("run-*")
    return folder


def test_a_finished_run_no_test_read_leaves_no_files(monkeypatch, tmp_path):
    outside = tmp_path / "not-temporary" / "kept"
    outside.mkdir(parents=True)
    # what it names outside the temporary folder is not stop_all's to remove
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "runs"))
    (tmp_path / "runs").mkdir()
    mod = _started(monkeypatch, tmp_path / "runs", 0, str(outside))
    folder = _folder(tmp_path / "runs")
    assert mod._running["run"].wait(60) == 0  # finished; no test waited for it
    mod.stop_all()
    assert not folder.exists()
    assert outside.is_dir()


def test_a_run_still_running_leaves_no_files(monkeypatch, tmp_path):
    mod = _started(monkeypatch, tmp_path, 60)
    folder = _folder(tmp_path)
    mod.stop_all()
    assert not folder.exists()


def test_the_files_of_a_run_a_test_read_are_the_tests(monkeypatch, tmp_path):
    mod = _started(monkeypatch, tmp_path, 0)
    assert mod.wait("run") == 0
    named = mod.files(mod.output("run"))
    folder = _folder(tmp_path)
    assert named == [str(folder)]
    mod.stop_all()
    assert (folder / "record.json").exists()
