"""The peers the drop-in tests compare against. `scripts/install.sh test` installs
Horovod (scripts/env_horovod.sh), so under CI (CI=true) a missing Horovod is a broken
install and fails the test; elsewhere the test skips with the reason."""
from __future__ import annotations

import os
import shutil
from types import ModuleType

import pytest

INSTALL_HINT = "run `bash scripts/env_horovod.sh` (scripts/install.sh test does)"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _missing(reason: str) -> None:
    if in_ci():
        pytest.fail(f"{reason}: CI must run the Horovod comparison; {INSTALL_HINT}",
                    pytrace=False)
    pytest.skip(f"{reason}; {INSTALL_HINT}")


def require_horovod_torch() -> ModuleType:
    """horovod.torch, or fail (CI) / skip (elsewhere) naming what is missing."""
    try:
        import horovod.torch as hvd
        return hvd
    except ImportError as exc:
        reason = f"horovod.torch is not importable: {exc}"
    _missing(reason)  # outside the except: the report shows no chained traceback
    raise AssertionError("unreachable")


def require_horovodrun() -> str:
    require_horovod_torch()
    path = shutil.which("horovodrun")
    if path is None:
        _missing("horovodrun is not on PATH")
    return path
