"""NETREDUCE_TRANSPORT on a host without an RDMA device: verbs is refused with a
reason a user can act on, auto falls back to UDP and still reduces."""
from __future__ import annotations

import numpy as np
import pytest

from netreduce import _native
from netreduce.worker import dataplane
from netreduce.errors import AdmissionError


def test_verbs_without_a_device_names_the_aggregator_and_the_fix(switch, monkeypatch):
    if _native.HAVE_VERBS:
        try:
            _native.probe_verbs(switch.address[0])
            pytest.skip("this host has an RDMA device with a RoCEv2 GID on loopback")
        except _native.EngineError:
            pass
    monkeypatch.setenv("NETREDUCE_TRANSPORT", "verbs")
    with pytest.raises(AdmissionError) as info:
        dataplane.connect(switch.address, "verbs-refused", 0, 1)
    msg = str(info.value)
    assert "NETREDUCE_TRANSPORT=verbs" in msg and "rank 0/1" in msg
    assert ("no RDMA device" in msg or "no active RDMA device" in msg or "no verbs transport" in msg)


def test_auto_falls_back_to_udp(switch, monkeypatch):
    monkeypatch.setenv("NETREDUCE_TRANSPORT", "auto")
    with dataplane.connect(switch.address, "verbs-auto", 0, 1) as conn:
        a = np.arange(1000, dtype=np.float32)
        assert np.array_equal(conn.allreduce(a.copy()), a)
        assert conn._verbs is None or conn._verbs.transport is None


def test_a_bad_transport_value_is_refused(monkeypatch):
    from netreduce import config
    monkeypatch.setenv("NETREDUCE_TRANSPORT", "infiniband")
    with pytest.raises(ValueError, match="auto, verbs or udp"):
        config.get("NETREDUCE_TRANSPORT")
