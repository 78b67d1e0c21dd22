"""A ``horovod`` package that is only a name mapping onto netreduce, for running
Horovod's own test files against netreduce (benchmarks/horovod_suite/run.py puts this
folder first on the ranks' PYTHONPATH, ahead of any real Horovod).

``horovod.torch`` *is* ``netreduce.torch`` (the same module object, not a copy), and
so for every module below it: ``horovod.torch.elastic`` is ``netreduce.torch.elastic``
if netreduce has one and a ModuleNotFoundError naming netreduce's module if not — a
missing API shows up as the failure it is. ``horovod.keras`` (Horovod's standalone-Keras
API) maps to ``netreduce.tensorflow.keras``: with Keras 3 the two are the same Keras.

Three small modules of Horovod's that its test files import for their own plumbing,
not as the framework API under test (a version compare, a thread starter, an
eager-mode probe), are served from ``_test_support/`` here; nothing else is.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys

__version__ = "0.28.1"  # the API level the mapping stands for (netreduce follows 0.28)

# Horovod name prefix -> netreduce module it stands for. Longest prefix first.
_MAPPED = (
    ("horovod.tensorflow.keras", "netreduce.tensorflow.keras"),
    ("horovod.tensorflow", "netreduce.tensorflow"),
    ("horovod.keras", "netreduce.tensorflow.keras"),
    ("horovod.torch", "netreduce.torch"),
    ("horovod.mxnet", "netreduce.mxnet"),
)
# Horovod's test plumbing (not framework API): served from files in this folder.
_SUPPORT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_test_support")
_SUPPORT = {
    "horovod.common": None,                     # a namespace-like empty package
    "horovod.common.util": "common_util.py",
    "horovod.runner": None,
    "horovod.runner.util": None,
    "horovod.runner.util.threads": "runner_threads.py",
    "horovod.tensorflow.util": "tensorflow_util.py",
}


def _target(fullname: str):
    for prefix, target in _MAPPED:
        if fullname == prefix or fullname.startswith(prefix + "."):
            return target + fullname[len(prefix):]
    return None


class _Alias(importlib.abc.Loader):
    """Loads ``horovod.X`` as the netreduce module it maps to (imported here)."""

    def __init__(self, module) -> None:
        self.module = module
        self.own_spec = module.__spec__

    def create_module(self, spec):
        return self.module

    def exec_module(self, module) -> None:
        # The import system stamped the horovod spec on the module; give netreduce's
        # back, so its own relative imports and reloads see the name it really has.
        module.__spec__ = self.own_spec


class _Empty(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        module.__path__ = []


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("horovod."):
            return None
        if fullname in _SUPPORT:
            if _SUPPORT[fullname] is None:
                return importlib.util.spec_from_loader(fullname, _Empty(), is_package=True)
            return importlib.util.spec_from_file_location(
                fullname, os.path.join(_SUPPORT_DIR, _SUPPORT[fullname]))
        mapped = _target(fullname)
        if mapped is None:
            raise ModuleNotFoundError(
                f"{fullname} has no netreduce counterpart in this mapping "
                f"(it maps {', '.join(p for p, _ in _MAPPED)})", name=fullname)
        if importlib.util.find_spec(mapped) is None:
            raise ModuleNotFoundError(f"{fullname}: netreduce has no {mapped}", name=fullname)
        module = importlib.import_module(mapped)
        return importlib.util.spec_from_loader(fullname, _Alias(module),
                                               is_package=hasattr(module, "__path__"))


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
