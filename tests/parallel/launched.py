"""For test files that run on every rank at once: they only make sense under a
launcher, and each is started under netreduce-run by one launching test, which its
skip reason names (tests/unit/test_launched_reasons.py holds each file to it)."""
import importlib
from typing import Optional

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


def initialized_by(framework: str, barrier_in: Optional[str] = None, autouse: bool = True):
    """A launched test file's ``initialized`` fixture (module scope): ``framework``'s
    init() before the file's first test, and its barrier() after the last, so that no
    rank goes on to the next file while another still runs this one's collectives.
    Under no launcher it does nothing: the file's multi-rank tests skip there, and
    the tests that run there start jobs of their own.

    barrier_in: the module whose barrier() ends it, where ``framework`` has none
    (netreduce.tensorflow.keras: netreduce.tensorflow's). autouse=False: only for the
    tests that ask for it by name."""
    def fixture():
        if not LAUNCHED:
            yield
            return
        importlib.import_module(framework).init()
        yield
        importlib.import_module(barrier_in or framework).barrier()

    return pytest.fixture(scope="module", autouse=autouse, name="initialized")(fixture)
