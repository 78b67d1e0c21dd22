"""Shared fixtures. Tiers: tests/unit (in-process, fast), tests/parallel (several
processes on loopback), tests/root (network namespaces / nftables; skipped with the
reason when not root)."""
from __future__ import annotations

import os
import shutil

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "root: needs root (network namespaces, nftables)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    config.addinivalue_line("markers", "softroce: boots a QEMU guest with Soft-RoCE (tests/softroce)")


def require_root(*tools: str) -> None:
    """Skip the calling test, with its reason, unless root and the tools exist."""
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces / nftables); run the suite as root")
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"needs '{tool}' (Debian package providing it is not installed)")


@pytest.fixture(scope="module")
def switch():
    """A netreduce-switch daemon on loopback, started the way users start it."""
    from netreduce.switch import spawn

    proc = spawn(host="127.0.0.1", port=0)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def installed(tmp_path_factory):
    """netreduce from a wheel of this checkout, in a throwaway venv (tests/installed.py);
    built once per session."""
    from tests.installed import install

    return install(tmp_path_factory.mktemp("installed"))
