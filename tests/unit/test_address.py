"""The one aggregator-address parser (netreduce/protocol/address.py): the default
port, IPv6 literals, host names, and errors that name the variable and the value."""
import pytest

from netreduce import api
from netreduce.protocol.address import format_address, parse_address, resolve


@pytest.mark.parametrize("text, want", [
    ("10.0.0.2:4791", ("10.0.0.2", 4791)),
    ("10.0.0.2", ("10.0.0.2", 4791)),           # no port: RoCEv2's 4791
    (" 10.0.0.2:5000 ", ("10.0.0.2", 5000)),
    ("[::1]:4791", ("::1", 4791)),
    ("[::1]", ("::1", 4791)),
    ("::1", ("::1", 4791)),                      # a bare IPv6 literal has no port
    ("[fe80::1%eth0]:7000", ("fe80::1%eth0", 7000)),
    ("agg-0", ("agg-0", 4791)),
    ("agg-0.cluster.lan:6000", ("agg-0.cluster.lan", 6000)),
    ("node_3:1", ("node_3", 1)),
])
def test_accepted_forms(text, want):
    assert parse_address(text) == want


@pytest.mark.parametrize("text, why", [
    ("", "it is empty"),
    ("h0:", "port '' is not a number"),
    ("h0:x", "port 'x' is not a number"),
    ("h0:0", "port '0' is not a number in 1..65535"),
    ("h0:65536", "port '65536'"),
    (":4791", "the host is missing"),
    ("[::1", "brackets must hold an IPv6 address"),
    ("[h0]:4791", "brackets must hold an IPv6 address"),
    ("[::1]4791", "unexpected '4791' after ']'"),
    ("::1:4791:x", "must be written \\[ADDRESS\\]:PORT"),
    ("1.2.3", "neither an IP address nor a host name"),
    ("two words", "neither an IP address nor a host name"),
    ("h0:1:2", "must be written"),
])
def test_errors_name_the_variable_and_the_value(text, why):
    with pytest.raises(ValueError, match=why) as info:
        parse_address(text, what="NETREDUCE_SWITCH")
    assert f"NETREDUCE_SWITCH={text!r}" in str(info.value)


def test_format_reads_back():
    for address in (("10.0.0.2", 4791), ("::1", 5000), ("agg-0", 1)):
        assert parse_address(format_address(address)) == address
    assert format_address(("::1", 5000)) == "[::1]:5000"


def test_host_names_resolve_ipv4_first():
    assert resolve(("localhost", 4791)) == ("127.0.0.1", 4791)
    assert resolve(("10.1.2.3", 9)) == ("10.1.2.3", 9)
    with pytest.raises(ValueError, match="'no-such-host.invalid' does not resolve"):
        resolve(("no-such-host.invalid", 4791))


def test_init_reads_netreduce_switch_with_the_same_parser():
    assert api._parse_address("agg-0") == ("agg-0", 4791)
    assert api._parse_address("[::1]:7") == ("::1", 7)
    with pytest.raises(ValueError, match="NETREDUCE_SWITCH='agg-0:x'"):
        api._parse_address("agg-0:x")


def test_launcher_refuses_a_bad_switch_address(capsys):
    from netreduce.launcher import command as launcher
    with pytest.raises(SystemExit) as info:
        launcher.run(["--switch", "agg-0:port", "-np", "1", "true"])
    assert info.value.code == 2
    assert "--switch='agg-0:port' is not an aggregator address" in capsys.readouterr().err
