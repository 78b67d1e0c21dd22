"""The aggregator's data threads run at --data-nice (settings.DEFAULTS["data_nice"], 0):
on a host they share with busy ranks a lower nice gets them a core sooner, at ~25 % more
CPU per byte (BENCHMARKS.md, issue 33, wirerate; docs/operations.md)."""
from __future__ import annotations

import os

import pytest

from netreduce.switch.settings import DEFAULTS, aggregator_args
from netreduce.testbed import proc_stat

_native = pytest.importorskip("netreduce._native")


def _data_thread_nices() -> list:
    """The nice of every nr-data-* thread of this process (/proc/self/task/*/stat)."""
    return [t.nice for t in proc_stat.threads() if t.comm.startswith("nr-data-")]


def _started(**kw):
    agg = _native.Aggregator(**aggregator_args(host="127.0.0.1", port=0, **kw))
    agg.start()
    return agg


def test_the_default_leaves_the_nice_and_the_binding_takes_it_from_python():
    assert DEFAULTS["data_nice"] == 0  # a lower one costs ~25 % more CPU per byte (docs)
    assert _native.AGGREGATOR_DEFAULTS["data_nice"] == DEFAULTS["data_nice"]


@pytest.mark.parametrize("threads", [1, 3])
def test_a_higher_nice_needs_no_privilege(threads):
    agg = _started(data_nice=5, threads=threads)
    try:
        assert agg.data_nice == 5
        assert _data_thread_nices() == [5] * threads
    finally:
        agg.stop()


def test_zero_leaves_the_threads_as_they_are():
    agg = _started(data_nice=0)
    try:
        assert agg.data_nice == os.getpriority(os.PRIO_PROCESS, 0)
        assert _data_thread_nices() == [agg.data_nice]
    finally:
        agg.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="a nice below 0 needs root or CAP_SYS_NICE")
def test_a_lower_nice_as_root():
    agg = _started(data_nice=-7, threads=2)
    try:
        assert agg.data_nice == -7
        assert _data_thread_nices() == [-7, -7]
    finally:
        agg.stop()
