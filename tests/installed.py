"""netreduce as a user gets it: a wheel of this checkout, installed in a throwaway venv.

The editable install the suite otherwise runs maps whole folders, so it hides a
package or data file that setup.py forgets to ship (netreduce.tensorflow.keras was
one). ``install(base)`` builds the wheel once per test session from a copy of the
checkout's files (git's list: tracked and not ignored), installs it with
``--no-deps`` into a venv that sees what the suite's own Python sees (numpy,
TensorFlow, torch come from there: ``make_venv``), and returns how to run its Python
so that nothing of the source tree can shadow it: from a directory outside the
checkout, with a copy of tests/ as the only thing on PYTHONPATH.

The native extension is not compiled a second time: setup.py packages the one the
editable install built (NETREDUCE_PREBUILT_NATIVE), so the wheel costs seconds.
"""
from __future__ import annotations

import glob
import os
import shutil
import site
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Installed:
    python: str            # the venv's interpreter
    bin_dir: str           # its console scripts (netreduce-run, ...)
    site: str              # where the wheel's netreduce lives
    cwd: str               # run from here: outside the checkout
    env: Dict[str, str]    # PYTHONPATH = a copy of tests/ only
    tests: str             # that copy's tests/ folder

    def run(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        return subprocess.run([self.python, *args], cwd=self.cwd, env=self.env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)


_lock = threading.Lock()
_installed: Dict[str, Installed] = {}


def _checkout_files() -> List[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True)
        return [f for f in out.stdout.decode().split("\0") if f and (ROOT / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = {"build", "dist", ".git", "__pycache__"}
        return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                if p.is_file() and not skip & set(p.relative_to(ROOT).parts)
                and p.suffix not in (".so", ".pyc")]


def _prebuilt_native() -> str:
    found = glob.glob(str(ROOT / "netreduce" / "_native*.so"))
    if not found:
        raise RuntimeError("netreduce/_native*.so is not built in this checkout "
                           "(pip install -e . builds it; scripts/install.sh does)")
    return found[0]


def _env(extra_path: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env["PYTHONPATH"] = extra_path
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _purelib(python: str) -> str:
    return subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          env=_env(""), stdout=subprocess.PIPE, text=True, check=True).stdout.strip()


def make_venv(venv: Path) -> str:
    """A venv (no pip of its own) that sees the packages this interpreter sees; its
    Python's path. ``--system-site-packages`` alone gives it the *base* interpreter's:
    run from inside a virtualenv (the README's command from a fresh ``python3 -m
    venv``, a pyenv, conda or uv Python), that misses whatever was installed into the
    virtualenv itself (TensorFlow, by scripts/install.sh). So a .pth file adds this
    interpreter's site directories after the venv's own (site.addsitedir: their .pth
    files too), and what the venv installs itself still comes first."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True)
    python = str(venv / "bin" / "python")
    outer = [d for d in site.getsitepackages() if os.path.isdir(d)]
    with open(os.path.join(_purelib(python), "_netreduce_outer_site.pth"), "w") as f:
        f.write("import site; " + "; ".join(f"site.addsitedir({d!r})" for d in outer) + "\n")
    return python


def install(base: Path) -> Installed:
    """The installed wheel (built and installed under ``base`` the first time)."""
    with _lock:
        key = str(ROOT)
        if key in _installed:
            return _installed[key]
        src, wheels, venv, home = base / "src", base / "wheels", base / "venv", base / "home"
        for rel in _checkout_files():
            dest = src / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest)
        build_env = dict(os.environ, NETREDUCE_PREBUILT_NATIVE=_prebuilt_native())
        build_env.pop("PYTHONPATH", None)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(wheels), str(src)], env=build_env,
                       check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        wheel = next(wheels.glob("netreduce-*.whl"))
        python = make_venv(venv)
        # the system's pip, installing into the venv (sys.prefix is the venv's)
        subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        str(wheel)], env=_env(""), check=True, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
        home.mkdir()
        shutil.copytree(ROOT / "tests", home / "tests",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        installed = Installed(python=python, bin_dir=str(venv / "bin"), site=_purelib(python),
                              cwd=str(home),
                              env=_env(str(home)), tests=str(home / "tests"))
        _installed[key] = installed
        return installed


def where(installed: Installed, module: str) -> Optional[str]:
    """The file ``module`` is imported from by the installed Python (None if it fails)."""
    proc = installed.run("-c", f"import {module} as m; print(m.__file__)")
    return proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 else None
