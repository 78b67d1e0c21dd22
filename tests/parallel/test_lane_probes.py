"""A lane's timeout probe asks for a held notice (docs/protocol.md, "Loss,
reordering, duplication"): a rank probed only its lane's oldest expired chunk, so
while that chunk's round waited for another rank (that rank's loss, or in a rack the
spine), the rank's own lost share of a newer chunk of the lane was not resent until
the old round completed. The probe now carries AckReq; a held notice answers "the
round has it, it waits for others", and the lane's next oldest chunk is probed at
once (issue 33, lossprobe)."""
from __future__ import annotations

import threading
import time

import numpy as np

from tests.parallel.test_held_notices import I32, _Fake, _engine


class _Stalled(_Fake):
    """The aggregator of a job of 2 ranks; rank 1's contribution is all 100s. The
    first message is answered at once (the engine's round-trip sample). In the second
    (two chunks, one lane), rank 1's share of chunk 0 comes only ``hold_s`` after the
    message starts (the fake then sends chunk 0's result unasked, as the aggregator
    does when the last share arrives); until then a probe of it that asks gets a held
    notice. Rank 0's first send of chunk 1 is lost; any later one completes it."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.msg_ids: list = []
        self.start = None
        self.c1_answered = None  # when chunk 1's result went out
        self.c0_released = None
        self.c1_sends = 0
        self.timer = None
        self.lock = threading.Lock()
        super().__init__()

    def _release(self, h: dict, payload: bytes, peer) -> None:
        with self.lock:
            self.c0_released = time.monotonic()
            self.result(h, payload, peer)

    def on_packet(self, h: dict, payload: bytes, peer) -> None:
        with self.lock:
            if h["msg_id"] not in self.msg_ids:
                self.msg_ids.append(h["msg_id"])
            if len(self.msg_ids) == 1:
                self.result(h, payload, peer)
                return
            if self.start is None:
                self.start = time.monotonic()
            if h["offset"] == 0:  # chunk 0: its round waits for rank 1
                if self.timer is None:
                    self.timer = threading.Timer(self.hold_s, self._release, (h, payload, peer))
                    self.timer.start()
                if self.c0_released is None and h["ack_req"]:
                    self.notice(h, peer)
                elif self.c0_released is not None:
                    self.result(h, payload, peer)  # a resend after it completed
                return
            self.c1_sends += 1
            if self.c1_sends == 1:
                return  # lost
            if self.c1_answered is None:
                self.c1_answered = time.monotonic()
            self.result(h, payload, peer)


def test_a_lost_share_behind_a_round_that_waits_for_another_rank_is_resent():
    hold_s = 1.5
    fake = _Stalled(hold_s)
    try:
        eng = _engine(fake)
        x = np.arange(16, dtype=np.int32)
        out = np.zeros_like(x)
        eng.allreduce(x, out, I32, 0)  # the round-trip sample
        np.testing.assert_array_equal(out, x + 100)
        before = eng.stats()
        x = np.arange(20000, dtype=np.int32)  # two chunks of 16,366 elements, lane 0
        out = np.zeros_like(x)
        eng.allreduce(x, out, I32, 0)
        np.testing.assert_array_equal(out, x + 100)
        st = eng.stats()
        assert fake.c1_answered is not None and fake.c0_released is not None
        # On main the lane probed only chunk 0 until its round completed: chunk 1 went
        # again only after rank 1's share came. Asked, the probe of chunk 0 is answered
        # "held", and chunk 1's probe follows while chunk 0 still waits.
        assert fake.c1_answered < fake.c0_released, (fake.c1_answered - fake.start, st)
        assert st["probe_notices"] - before["probe_notices"] >= 1, st
    finally:
        fake.close()
        if fake.timer is not None:
            fake.timer.cancel()
