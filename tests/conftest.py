"""Shared fixtures. Tiers: tests/unit (in-process, fast), tests/parallel (several
processes on loopback), tests/root (network namespaces / nftables; skipped with the
reason when not root)."""
from __future__ import annotations

import os
import shutil

import pytest


_LEAKS = None


def pytest_configure(config):
    global _LEAKS
    from tests.leaks import Watch

    _LEAKS = Watch()
    config.addinivalue_line("markers", "root: needs root (network namespaces, nftables)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    config.addinivalue_line("markers", "softroce: boots a QEMU guest with Soft-RoCE (tests/softroce)")
    _hypothesis_without_timing()


def _hypothesis_without_timing() -> None:
    """Property tests check results, never time: no per-example deadline and no
    too_slow health check (a loaded host made test_wire's round trip fail on generation
    time alone, 12-06). Timings belong in benchmarks/."""
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:  # the tests that use it skip or fail on their own import
        return
    settings.register_profile("netreduce", deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("netreduce")


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


@pytest.fixture(scope="module", autouse=True)
def _orphaned_daemons(request):
    """Notes any aggregator daemon orphaned by this module (tests/leaks.py)."""
    yield
    if _LEAKS is not None:
        _LEAKS.after(request.module.__name__)


def pytest_collection_finish(session):
    """Slow builds of the selected tests start now, niced, in the idle time of the tests
    before them (tests/prebuild.py)."""
    from tests import prebuild

    prebuild.start({item.nodeid for item in session.items})


def pytest_sessionfinish(session):
    from tests import prebuild

    prebuild.stop_all()


def pytest_terminal_summary(terminalreporter):
    lines = _LEAKS.left_running() if _LEAKS is not None else []
    if lines:
        terminalreporter.section("netreduce-switch daemons left running (killed now)")
        for line in lines:
            terminalreporter.write_line(line)
