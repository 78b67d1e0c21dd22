"""A message's nap check (engine/nap.h, NapClock) over scripted drains: the naps' first
kCheckDatagrams (1024) must keep kKeepRate (0.95) of the rate measured before them. A
burst in that short first sample (~12 drains; at 1 Gbit/s the testbed's link read 0.087-
0.099 datagrams/us where it carries 0.083) made naps that kept the line rate fail, and
the message napped no more: a failed check measures again without naps and checks once
more; naps that cost rate both times end the message's naps."""
from __future__ import annotations

from typing import List, Tuple

import pytest

_native = pytest.importorskip("netreduce._native")

WINDOW = 1464  # datagrams in the 2 MiB window at MTU 1500: skipped, and outstanding
GRO = 44       # datagrams per coalesced receive


def drains(t: float, count: int, per_us: float) -> Tuple[List[Tuple[int, int, int]], float]:
    """`count` drains of GRO datagrams at `per_us` datagrams per microsecond from `t`."""
    out = []
    for _ in range(count):
        t += GRO / per_us
        out.append((int(t), GRO, WINDOW))
    return out, t


def script(phases: List[Tuple[int, float]]):
    steps, t = drains(0.0, WINDOW // GRO + 1, 0.083)  # the first window: not measured
    for count, rate in phases:
        more, t = drains(t, count, rate)
        steps += more
    return _native.nap_clock_script(WINDOW, GRO, steps)


def test_a_burst_before_the_naps_does_not_end_them():
    # 13 drains read at 0.099 (a burst), then the link's 0.083 for the rest of the message
    naps, off = script([(13, 0.099), (200, 0.083)])
    assert not off
    assert all(n > 0 for n in naps[-100:]), naps  # naps again after measuring again


def test_naps_that_cost_rate_end_the_messages_naps():
    # the rate while napping is 0.6 of the rate before, in both checks
    naps, off = script([(13, 0.083), (24, 0.05), (13, 0.083), (24, 0.05), (100, 0.05)])
    assert off
    assert all(n == 0 for n in naps[-100:])


def test_naps_that_keep_the_rate_stay_on():
    naps, off = script([(213, 0.083)])
    assert not off
    assert sum(1 for n in naps if n > 0) > 150
