"""A message's nap check (engine/nap.h, NapClock) over scripted drains: the naps' first
kCheckDatagrams (1024) must keep kKeepRate (0.95) of the rate measured before them, or
the message naps no more. The rate before is a ~6 ms sample; a burst in it (at 1 Gbit/s
the testbed's link read 0.087-0.099 datagrams/us where it carries 0.083: its shaper's
128 KiB bucket) failed naps that kept the line rate. The check uses the sample's slower
half, which a burst cannot speed up."""
from __future__ import annotations

from typing import List, Tuple

import pytest

_native = pytest.importorskip("netreduce._native")

WINDOW = 1464  # datagrams in the 2 MiB window at MTU 1500: skipped, and outstanding
GRO = 44       # datagrams per coalesced receive
LINK = 0.083   # 1 Gbit/s at MTU 1500, datagrams per microsecond


def script(phases: List[Tuple[int, float]]):
    """The first window at the link's rate, then (drains, datagrams per us) phases; each
    drain takes GRO datagrams and allows a nap. (per drain naps, ended off)."""
    steps, t = [], 0.0
    for count, per_us in [(WINDOW // GRO + 1, LINK)] + phases:
        for _ in range(count):
            t += GRO / per_us
            steps.append((int(t), GRO, WINDOW))
    return _native.nap_clock_script(WINDOW, GRO, steps)


def test_a_burst_before_the_naps_does_not_end_them():
    # 6 drains in a burst (a bucket of ~260 datagrams let go), then the link's rate
    naps, off = script([(6, 0.15), (7, LINK), (200, LINK)])
    assert not off
    assert all(n > 0 for n in naps[-150:])


def test_naps_that_cost_rate_end_the_messages_naps():
    naps, off = script([(13, LINK), (24, 0.05), (100, 0.05)])
    assert off
    assert all(n == 0 for n in naps[-100:])


def test_naps_that_keep_the_rate_stay_on():
    naps, off = script([(213, LINK)])
    assert not off
    assert sum(1 for n in naps if n > 0) > 150
