"""tests/installed.py's throwaway venv sees what the suite's Python sees, also when the
suite runs from a virtualenv of its own (the README's test command from a fresh
``python3 -m venv``): a venv made from inside another gets the *base* interpreter's
site-packages from --system-site-packages, not the outer venv's, where install.sh put
TensorFlow (issue 35: six failures from a fresh venv)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.installed import ROOT


def _run(python: str, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PYTHONPATH=str(ROOT), PYTHONNOUSERSITE="1")
    return subprocess.run([python, "-c", code], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)


def test_a_throwaway_venv_made_inside_a_venv_sees_the_outer_venvs_packages(tmp_path: Path):
    outer = tmp_path / "outer"  # as `python3 -m venv` makes one: no system site-packages
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(outer)], check=True)
    outer_python = str(outer / "bin" / "python")
    purelib = _run(outer_python, "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    (Path(purelib.stdout.strip()) / "only_in_the_outer_venv.py").write_text("WHERE = 'outer'\n")
    made = _run(outer_python, "from pathlib import Path; from tests.installed import make_venv; "
                              f"print(make_venv(Path({str(tmp_path / 'inner')!r})))")
    assert made.returncode == 0, made.stdout
    inner_python = made.stdout.strip().splitlines()[-1]
    seen = _run(inner_python, "import only_in_the_outer_venv as m, sys; print(m.WHERE, sys.prefix)")
    assert seen.returncode == 0, seen.stdout
    assert seen.stdout.split() == ["outer", str(tmp_path / "inner")], seen.stdout
    # ... after the inner venv's own packages, which win: a wheel installed there is
    # the one imported (tests/parallel/test_wheel.py).
    inner_lib = _run(inner_python, "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    (Path(inner_lib.stdout.strip()) / "only_in_the_outer_venv.py").write_text("WHERE = 'inner'\n")
    assert _run(inner_python, "import only_in_the_outer_venv as m; print(m.WHERE)").stdout.split() \
        == ["inner"]
