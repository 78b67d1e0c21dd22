"""Which messages may nap (engine/nap.h, NapRest): a message whose naps cost delivery
rate stops napping; only kOffStrikes (2) such messages in a row rest the engine's next
kRestMessages (16). One false verdict -- the rate before the naps is a short sample a
backlog can inflate -- must not take a rank's naps away for the next 16 messages
(issue 33: at 1 Gbit/s one rank in most benchmark runs napped in none of its messages)."""
from __future__ import annotations

import pytest

_native = pytest.importorskip("netreduce._native")


def test_one_off_message_does_not_rest_the_next():
    # a warm-up whose verdict was off, then messages whose naps keep the rate
    assert _native.nap_rest_script(["off"] + ["kept"] * 6) == [True] * 7


def test_two_off_in_a_row_rest_sixteen_messages():
    allowed = _native.nap_rest_script(["off", "off"] + ["-"] * 17)
    assert allowed == [True, True] + [False] * 16 + [True]


def test_a_kept_message_between_offs_clears_the_strike():
    assert _native.nap_rest_script(["off", "kept", "off", "kept", "off"]) == [True] * 5


def test_messages_not_judged_keep_the_strike():
    # a small message (no naps, no verdict) between two offs: still two in a row
    allowed = _native.nap_rest_script(["off", "-", "off", "-"])
    assert allowed == [True, True, True, False]


def test_after_a_rest_one_more_off_rests_again():
    # the rest proved the link does not bind: a rank that tries again and loses rate
    # rests at once (the strikes are cleared only by a message whose naps kept the rate)
    verdicts = ["off", "off"] + ["-"] * 16 + ["off"] + ["-"] * 16 + ["-"]
    allowed = _native.nap_rest_script(verdicts)
    assert allowed[18] is True and allowed[19:35] == [False] * 16 and allowed[35] is True
