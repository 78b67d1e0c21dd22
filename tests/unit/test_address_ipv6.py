"""IPv6 in the address helpers the control plane and the daemon share."""
from __future__ import annotations

import socket

import pytest

from netreduce.protocol.address import (connect_address, family_of, format_address,
                                       parse_address, resolve, unmap)


def test_ipv4_mapped_addresses_read_as_ipv4():
    assert unmap("::ffff:10.0.0.3") == "10.0.0.3"
    assert unmap("fd00::3") == "fd00::3" and unmap("10.0.0.3") == "10.0.0.3"
    assert unmap("agg-0") == "agg-0"


def test_family_of_listen_addresses():
    assert family_of("::") == family_of("::1") == family_of("fd00::2") == socket.AF_INET6
    assert family_of("0.0.0.0") == family_of("127.0.0.1") == socket.AF_INET
    assert family_of("localhost") in (socket.AF_INET, socket.AF_INET6)


def test_wildcards_are_reached_on_loopback_of_their_family():
    assert connect_address(("::", 4791)) == ("::1", 4791)
    assert connect_address(("0.0.0.0", 5)) == ("127.0.0.1", 5)
    assert connect_address(("fd00::2", 5)) == ("fd00::2", 5)


@pytest.mark.parametrize("text", ["[::1]:4791", "[fd00:a:4e:fa::fa]:17", "10.0.0.2:4791"])
def test_ready_line_addresses_round_trip(text):
    # netreduce-switch prints format_address((host, port)); spawn() parses it back.
    assert format_address(parse_address(text)) == text


def test_resolve_keeps_ipv6_literals_and_unmaps():
    assert resolve(("::1", 4791)) == ("::1", 4791)
    assert resolve(("::ffff:127.0.0.1", 4791)) == ("127.0.0.1", 4791)
