"""A multi-rank test file skips, outside a launcher, naming the test that starts it
under netreduce-run (the TensorFlow files named test_torch_launch.py: issue 35): each
file marked only_when_launched_by(LAUNCHER) is started by LAUNCHER, and each file a
launching test starts is marked with that launcher."""
from __future__ import annotations

import ast
import re
from pathlib import Path

PARALLEL = Path(__file__).resolve().parent.parent / "parallel"
LAUNCHERS = ["test_torch_launch.py", "test_tensorflow_launch.py", "test_mxnet.py",
             "test_mxnet_collectives.py"]


def _strings(path: Path) -> set:
    return {n.value for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _is_pytest_file(path: Path) -> bool:
    """A file of tests each rank runs (not a worker script the launcher starts)."""
    return re.search(r"^(import pytest|\w+ = pytest\.importorskip)", path.read_text(), re.M) \
        is not None


def _marked_by(path: Path) -> set:
    return set(re.findall(r'only_when_launched_by\(\s*"tests/parallel/([^"]+)"',
                          path.read_text()))


def test_every_multi_rank_file_names_the_test_that_launches_it():
    started = {launcher: {s for s in _strings(PARALLEL / launcher)
                          if re.fullmatch(r"[\w]+\.py", s) and (PARALLEL / s).is_file()
                          and s != launcher and _is_pytest_file(PARALLEL / s)}
               for launcher in LAUNCHERS}
    marked = {p.name: _marked_by(p) for p in PARALLEL.glob("*.py") if _marked_by(p)}
    assert marked, "no file uses only_when_launched_by"
    for name, launchers in marked.items():
        assert len(launchers) == 1, (name, launchers)
        launcher = next(iter(launchers))
        assert launcher in started and name in started[launcher], \
            f"{name} says it is run by {launcher}, which does not start it"
    for launcher, names in started.items():
        for name in names:
            assert _marked_by(PARALLEL / name) == {launcher}, \
                f"{launcher} starts {name}, whose skip reason does not name it"
