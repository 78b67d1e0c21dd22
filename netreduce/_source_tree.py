"""A clear ImportError when netreduce is imported from a checkout that was not built
in place, the way numpy explains itself when imported from its source directory.

After ``pip install .`` (not ``-e``) the built package lives in site-packages, but
Python run from the checkout puts the current directory first on sys.path, so the
source tree's netreduce/ shadows it: that copy has no native module
(netreduce._native) and no netreduce.torch / .tensorflow / .mxnet (those are
frameworks/*, mapped into the package only by installing). Without help the user
sees "cannot import name '_native'". ``install()`` appends a finder to the end of
sys.meta_path: it is asked only after every real finder has failed, and then
raises an ImportError saying what happened and what to do."""
from __future__ import annotations

import glob
import importlib.abc
import os
import sys
from typing import Optional

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.dirname(PACKAGE_DIR)
# Submodules that exist only once built or installed.
BUILT = {"netreduce._native": "the native module netreduce._native is not built there",
         "netreduce.torch": "netreduce.torch is frameworks/torch there, which only installing "
                            "maps into the package",
         "netreduce.tensorflow": "netreduce.tensorflow is frameworks/tensorflow there, which only "
                                 "installing maps into the package",
         "netreduce.mxnet": "netreduce.mxnet is frameworks/mxnet there, which only installing "
                            "maps into the package"}


def is_source_tree(package_dir: str = PACKAGE_DIR) -> bool:
    root = os.path.dirname(package_dir)
    return os.path.isfile(os.path.join(root, "setup.py")) and \
        os.path.isdir(os.path.join(root, "native"))


def _shadowed_install(package_dir: str = PACKAGE_DIR) -> Optional[str]:
    """Another netreduce on sys.path that has its native module built."""
    for entry in sys.path:
        other = os.path.join(os.path.abspath(entry or os.curdir), "netreduce")
        if os.path.realpath(other) != os.path.realpath(package_dir) and \
                glob.glob(os.path.join(other, "_native*.so")):
            return other
    return None


def message(fullname: str, package_dir: str = PACKAGE_DIR) -> str:
    what = BUILT.get(fullname, f"{fullname} is not there")
    if not is_source_tree(package_dir):
        return (f"cannot import {fullname}: {what} in the netreduce package at {package_dir}; "
                "the installation is incomplete: reinstall it (pip install netreduce, or "
                "pip install . from a checkout)")
    shadow = _shadowed_install(package_dir)
    shadowed = f" (it shadows the installed netreduce at {shadow})" if shadow else ""
    return (f"you are importing netreduce from its source tree at "
            f"{os.path.dirname(package_dir)}{shadowed}; {what}: run from another directory "
            "to use the installed package, or build the checkout in place with "
            "`pip install -e .`")


class _Explain(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # noqa: D401
        if fullname in BUILT:
            # ImportError, not ModuleNotFoundError: `from netreduce import _native`
            # would swallow the latter and say "cannot import name" again.
            raise ImportError(message(fullname), name=fullname)
        return None


def install() -> None:
    if not any(isinstance(f, _Explain) for f in sys.meta_path):
        sys.meta_path.append(_Explain())

