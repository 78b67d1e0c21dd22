"""For test files that run on every rank at once: they only make sense under a
launcher, and each is started under netreduce-run by one launching test, which its
skip reason names (tests/unit/test_launched_reasons.py holds each file to it)."""
import pytest

from netreduce.environment import discover

LAUNCHED = discover().size > 1


def only_when_launched_by(launcher: str):
    """Skip unless under a launcher, saying which test file starts this one."""
    return pytest.mark.skipif(
        not LAUNCHED, reason=f"multi-rank test: run by {launcher} under netreduce-run")


def skip_module_unless_launched(mark) -> None:
    """Call it before a slow framework import (TensorFlow and Keras: seconds of the suite's
    own process, for tests it only skips): outside a launcher, skip the whole module
    with ``mark``'s reason (only_when_launched_by's) there and then."""
    if not LAUNCHED:
        pytest.skip(mark.kwargs["reason"], allow_module_level=True)
