"""What the testbed decides before touching the kernel: names, addresses, rates, and
the message a user without root gets. Runs everywhere (no root needed)."""
from __future__ import annotations

import pytest

from netreduce.testbed import TestbedError, make_plan, parse_rate, why_unusable
from netreduce.testbed import cli


def test_rates_parse_like_tc():
    assert parse_rate("1gbit") == 10**9
    assert parse_rate("500mbit") == 500 * 10**6
    assert parse_rate("2.5Gbit") == 2_500_000_000
    assert parse_rate("100mbps") == 800 * 10**6  # tc: bps = bytes per second
    with pytest.raises(TestbedError, match="cannot parse rate"):
        parse_rate("fast")


def test_plan_names_addresses_and_aggregator_rate():
    plan = make_plan(4, "1gbit", name="nrtb")
    assert [h.netns for h in plan.hosts] == ["nrtb-h0", "nrtb-h1", "nrtb-h2", "nrtb-h3"]
    assert [h.address for h in plan.hosts] == ["10.77.0.1", "10.77.0.2", "10.77.0.3", "10.77.0.4"]
    assert plan.aggregator.address == "10.77.0.250" and plan.bridge_address == "10.77.0.254"
    assert plan.aggregator.rate_bps == 4 * 10**9  # a switch's aggregate capacity
    assert plan.node("2") is plan.hosts[2] and plan.node("h3") is plan.hosts[3]
    assert plan.node("agg") is plan.aggregator
    with pytest.raises(TestbedError, match="no host"):
        plan.node(4)
    assert max(len(n.peer) for n in make_plan(200, "1gbit", name="abcdefghi").nodes) <= 15


@pytest.mark.parametrize("kw, match", [
    (dict(hosts=0), "--hosts"),
    (dict(loss=1.0), "--loss"),
    (dict(name="Bad-Name"), "testbed name"),
    (dict(name="waytoolongname"), "testbed name"),
    (dict(subnet="10.0.0.0/16"), "/24"),
    (dict(mtu=100), "--mtu"),
])
def test_plan_rejects_bad_input_with_the_knob_named(kw, match):
    args = dict(hosts=2, rate="1gbit")
    args.update(kw)
    with pytest.raises(TestbedError, match=match):
        make_plan(args.pop("hosts"), args.pop("rate"), **args)


def test_not_root_gives_a_clear_message(monkeypatch, capsys):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    reason = why_unusable()
    assert reason and "needs root" in reason
    assert cli.main(["up", "--hosts", "2"]) == 2
    assert "needs root" in capsys.readouterr().err
