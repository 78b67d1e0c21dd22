"""Import SimGrid's Python module, wherever it is installed.

`pip install simgrid` puts it on sys.path. Debian's ``python3-simgrid`` (what
scripts/env_simgrid.sh installs: seconds, against PyPI's source build that needs
pybind11<3) puts one extension module in /usr/lib/python3/dist-packages, which
/usr/bin/python3 sees and a pyenv or venv python3 does not. The extension is built
for CPython 3.11's ABI, so any 3.11 interpreter can load that one file; we load it
by path rather than adding the whole Debian dist-packages to sys.path (which would
mix Debian's numpy with ours)."""
from __future__ import annotations

import glob
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Optional

DEBIAN_DIRS = ("/usr/lib/python3/dist-packages",)


def find_debian() -> Optional[str]:
    tag = f"cpython-{sys.version_info[0]}{sys.version_info[1]}"
    for d in DEBIAN_DIRS:
        for path in sorted(glob.glob(f"{d}/simgrid.{tag}-*.so")):
            return path
    return None


def load() -> ModuleType:
    """The simgrid module, or ImportError saying how to get it."""
    if "simgrid" in sys.modules:
        return sys.modules["simgrid"]
    try:
        import simgrid  # type: ignore[import-not-found]
        return simgrid
    except ImportError:
        pass
    path = find_debian()
    if path is None:
        raise ImportError(
            "SimGrid's Python module is not installed for this Python "
            f"({sys.version.split()[0]}): run `bash scripts/env_simgrid.sh` (Debian "
            "python3-simgrid, CPython 3.11) or `pip install simgrid 'pybind11<3'`")
    loader = importlib.machinery.ExtensionFileLoader("simgrid", path)
    spec = importlib.util.spec_from_file_location("simgrid", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules["simgrid"] = module
    return module


def available() -> bool:
    try:
        load()
        return True
    except ImportError:
        return False
