"""Importing netreduce from a checkout that was installed with `pip install .` but not
built in place: the source tree shadows the installed package and has no native
module nor netreduce.torch. The ImportError must say so and what to do."""
import os
import pathlib
import shutil
import site
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = r"""
import netreduce
print("IMPORTED", netreduce.__file__)
for stmt in ("from netreduce import _native", "import netreduce.torch",
             "from netreduce.worker import dataplane"):
    try:
        exec(stmt)
        print("NO ERROR", stmt)
    except ImportError as exc:
        print("ERROR", type(exc).__name__, exc)
"""


def _copy_package(dst: pathlib.Path, with_native: bool) -> None:
    shutil.copytree(ROOT / "netreduce", dst / "netreduce",
                    ignore=shutil.ignore_patterns("__pycache__", *(() if with_native else ("*.so",))))


def test_source_tree_without_native_module_says_what_to_do(tmp_path):
    checkout = tmp_path / "checkout"
    _copy_package(checkout, with_native=False)
    (checkout / "setup.py").write_text("# the checkout's setup.py\n")
    (checkout / "native").mkdir()
    installed = tmp_path / "site"
    installed.mkdir()
    so = list((ROOT / "netreduce").glob("_native*.so"))
    if so:  # the `pip install .` copy: a package with its native module built
        _copy_package(installed, with_native=True)
    # -S: no .pth files, hence no editable-install finder that would map the
    # checkout's missing pieces back to this repository; site-packages by hand.
    path = os.pathsep.join([str(installed), *site.getsitepackages()])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = subprocess.run([sys.executable, "-S", "-c", SCRIPT], cwd=checkout, capture_output=True,
                         text=True, timeout=60, env=dict(env, PYTHONPATH=path))
    lines = out.stdout.splitlines()
    assert lines and lines[0] == f"IMPORTED {checkout / 'netreduce' / '__init__.py'}", out
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    assert len(errors) == 3, out.stdout + out.stderr
    for line in errors:
        assert line.startswith("ERROR ImportError you are importing netreduce from its source "
                               f"tree at {checkout}"), line
        assert "run from another directory" in line and "pip install -e ." in line, line
        assert "cannot import name" not in line, line
        if so:
            assert f"it shadows the installed netreduce at {installed / 'netreduce'}" in line
    assert "the native module netreduce._native is not built there" in errors[0]
    assert "netreduce.torch is frameworks/torch there" in errors[1]


def test_a_built_checkout_imports_normally():
    out = subprocess.run([sys.executable, "-c", "import netreduce, netreduce.torch"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
