"""NETREDUCE_ICRC_CHECK: which received packets' RoCEv2 ICRC the aggregator computes.

Under `auto` (the default) a packet that a kernel UDP socket delivered from a sender
that set its UDP checksum (BTH byte 8 bit 0x08, which netreduce's senders set) is not
checked a second time: the kernel already dropped it had that checksum been wrong.
A standard RoCE sender leaves the bit clear (and sends UDP checksum 0): its ICRC is
always checked. `always` checks every packet. The packets here are forged with a
wrong ICRC on purpose, so that which path they took shows in the counters."""
from __future__ import annotations

import socket
import struct
import time
import uuid

import numpy as np
import pytest

from netreduce import _native
from netreduce.protocol.client import ControlClient
from netreduce.switch import spawn
from netreduce.worker import dataplane
from tests.unit.test_wire import reference_icrc
from tests.raw_register import data_socket, register

BAD_ICRC = b"\xde\xad\xbe\xef"


@pytest.fixture(params=["auto", "always"])
def checked_switch(request, monkeypatch):
    """A daemon started with NETREDUCE_ICRC_CHECK set as a user would set it."""
    monkeypatch.setenv("NETREDUCE_ICRC_CHECK", request.param)
    # RoCE-sized payloads: loopback's MTU would give jumbo packets, which carry no ICRC
    proc = spawn(host="127.0.0.1", port=0, payload_bytes=1024)
    yield request.param, proc
    proc.stop()


def _forge(probe: ControlClient, address, *, udp_checksum: int):
    """One contribution of a world-size-1 job with a wrong ICRC, from a kernel UDP
    socket (which sets the UDP checksum, as netreduce's senders do). Waits (up to 20 s,
    for a loaded machine) until the daemon has either completed the round or dropped
    the packet; returns the job's counters then and what came back, if anything."""
    job = "icrc-" + uuid.uuid4().hex[:6]
    s = data_socket(probe)
    grant = register(probe, job, 0, 1, s)
    payload = np.arange(16, dtype=np.float32).tobytes()
    fields = {"length": len(payload), "dtype": 0, "op": 0, "key": grant["key"],
              "dest_qp": grant["job_index"] << 12, "slot": 0, "psn": 7,
              "udp_checksum": udp_checksum}
    packet = _native.encode_header(fields) + payload + BAD_ICRC
    with s:
        s.sendto(packet, (address[0], grant["data_port"]))
        deadline = time.monotonic() + 20
        while True:
            counters = probe.call("counters")["jobs"][job]
            if counters["slots_completed"] or counters["drops"] or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        s.settimeout(5.0 if counters["slots_completed"] else 0.2)
        try:
            reply, _ = s.recvfrom(65536)
        except socket.timeout:
            reply = b""
        sport = s.getsockname()[1]
    return counters, reply, payload, grant["data_port"], sport


def test_kernel_checked_packet_skips_the_icrc_only_under_auto(checked_switch):
    mode, proc = checked_switch
    with ControlClient(proc.address) as probe:
        counters, reply, payload, dport, sport = _forge(probe, proc.address, udp_checksum=1)
    if mode == "auto":
        # accepted on the kernel's UDP checksum: the round completed and its result came back
        assert counters["drop_bad_icrc"] == 0 and counters["slots_completed"] == 1, counters
        h = _native.decode_header(reply)
        assert h["result"] and h["udp_checksum"] and h["length"] == len(payload), h
        assert reply[32:32 + len(payload)] == payload
        # the result still carries a valid ICRC, computed over the bit it sets
        icrc = struct.unpack("<I", reply[-4:])[0]
        assert icrc == reference_icrc("127.0.0.1", "127.0.0.1", dport, sport, reply[:32],
                                      reply[32:-4], 0) != 0
    else:
        assert counters["drop_bad_icrc"] == 1 and counters["slots_completed"] == 0, counters
        assert reply == b""


def test_standard_roce_sender_is_always_checked(checked_switch):
    """Bit clear (a RoCE NIC's packet): the ICRC is computed in either mode."""
    _, proc = checked_switch
    with ControlClient(proc.address) as probe:
        counters, reply, *_ = _forge(probe, proc.address, udp_checksum=0)
    assert counters["drop_bad_icrc"] == 1 and counters["slots_completed"] == 0, counters
    assert reply == b""


@pytest.mark.parametrize("rank_mode", ["auto", "always"])
def test_allreduce_exact_with_either_mode_on_either_side(checked_switch, rank_mode, monkeypatch):
    """Ranks under `always` check every result's ICRC and drop one that fails (then
    resend until their timeout): an exact sum within it shows that results carry valid
    ICRCs whatever the daemon's mode."""
    _, proc = checked_switch
    monkeypatch.setenv("NETREDUCE_ICRC_CHECK", rank_mode)
    job = "icrc-e2e-" + uuid.uuid4().hex[:6]
    # payloads of RoCE size (ICRC on every packet), one rank: results come from the
    # aggregator alone
    with dataplane.connect(proc.address, job, 0, 1, timeout=20.0) as conn:
        a = np.arange(300_000, dtype=np.float32)
        want = a.copy()
        conn.allreduce(a)
        np.testing.assert_array_equal(a, want)
        counters = conn.counters()["jobs"][job]
    assert counters["drop_bad_icrc"] == 0 and counters["slots_completed"] > 0


def test_bad_value_is_refused_with_the_knob_named():
    with pytest.raises(ValueError, match="NETREDUCE_ICRC_CHECK"):
        from netreduce.switch.settings import aggregator_args
        _native.Aggregator(**aggregator_args(host="127.0.0.1", port=0, icrc_check="sometimes"))
