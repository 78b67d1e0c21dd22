"""Fixtures shared by the root (network namespace) tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def native():
    """Skips the module, saying why, when the native extension is not built."""
    try:
        from netreduce import _native  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"netreduce._native is not built ({exc}); build it with `pip install -e .`")
