"""How a job's payload is chosen from its ranks' paths (netreduce/switch/payload.py,
docs/protocol.md "Payload size"): the smallest view wins, the cap caps, and the
reason names the path and the rank that decided it."""
import pytest

from netreduce.switch.payload import JobPayload, views_of


def formula(mtu: int, ipv6: bool) -> int:
    """IP + UDP + BTH + RETH + ImmDt + ICRC around the payload, 8-byte multiple."""
    room = mtu - (40 if ipv6 else 20) - 8 - 12 - 16 - 4 - 4
    return 0 if room < 8 else min(65464, room // 8 * 8)


def test_payload_for_mtu_matches_the_wire_layout():
    native = pytest.importorskip("netreduce._native")
    for mtu in (576, 1280, 1500, 4200, 9000, 65535, 65536):
        for ipv6 in (False, True):
            assert native.payload_for_mtu(mtu, ipv6) == formula(mtu, ipv6), (mtu, ipv6)
    assert native.payload_for_mtu(1500) == 1432 and native.payload_for_mtu(9000) == 8936
    assert native.payload_for_mtu(65535) == native.MAX_PAYLOAD  # loopback: the jumbo extension
    assert native.payload_for_mtu(40) == 0


def test_smallest_view_of_any_rank_decides():
    plan = JobPayload(cap=65464, explicit=False)
    plan.add(views_of(0, "h0", "10.0.0.1", (9000, False), (9000, False), formula))
    assert plan.choose() == (8936, "payload 8936 B: path MTU 9000 reported by rank 0 "
                                   "(host h0, 10.0.0.1)")
    # a later rank whose own link is narrower lowers it, and is named
    plan.add(views_of(2, "h2", "10.0.0.3", (1500, False), (9000, False), formula))
    assert plan.choose() == (1432, "payload 1432 B: path MTU 1500 reported by rank 2 "
                                   "(host h2, 10.0.0.3)")
    # a larger one never raises it again
    plan.add(views_of(1, "h1", "10.0.0.2", (65535, False), None, formula))
    assert plan.choose()[0] == 1432


def test_the_aggregators_own_route_counts_too():
    plan = JobPayload(cap=65464, explicit=False)
    plan.add(views_of(1, "", "10.0.0.2", (9000, False), (1500, False), formula))
    payload, why = plan.choose()
    assert payload == 1432 and "of the aggregator's route toward rank 1 (10.0.0.2)" in why


def test_loopback_keeps_the_jumbo_extension():
    plan = JobPayload(cap=65464, explicit=False)
    plan.add(views_of(0, "h", "127.0.0.1", (65535, False), (65535, False), formula))
    payload, why = plan.choose()
    assert payload == 65464
    assert why.startswith("payload 65464 B: path MTU 65535 (loopback) reported by rank 0")
    assert "the wire's largest (jumbo extension)" in why


def test_explicit_payload_bytes_caps_and_says_so():
    plan = JobPayload(cap=4096, explicit=True)
    plan.add(views_of(0, "h0", "10.0.0.1", (9000, False), None, formula))
    assert plan.choose() == (4096, "payload 4096 B: netreduce-switch --payload-bytes 4096 "
                                   "(the narrowest path, path MTU 9000 reported by rank 0 "
                                   "(host h0, 10.0.0.1), allows 8936 B)")
    plan.add(views_of(1, "h1", "10.0.0.2", (1500, False), None, formula))
    assert plan.choose()[0] == 1432  # an explicit cap above the path still follows the path


def test_ipv6_header_is_larger():
    plan = JobPayload(cap=65464, explicit=False)
    plan.add(views_of(0, "h0", "fe80::1", (1500, True), None, formula))
    assert plan.choose()[0] == 1416


def test_no_view_and_no_room():
    assert JobPayload(cap=8192, explicit=True).choose()[0] == 8192
    plan = JobPayload(cap=65464, explicit=False)
    plan.add(views_of(0, "h0", "10.0.0.1", (68, False), None, formula))
    with pytest.raises(ValueError, match="path MTU 68 reported by rank 0 .* leaves no room"):
        plan.choose()


def test_default_slots_hold_two_mib_whatever_the_payload_cap():
    from netreduce.switch.daemon import default_slots
    assert default_slots(None, 65464) == 32          # the wire's largest payload
    assert default_slots(65464, 65464) == 32
    assert default_slots(4096, 65464) == 511         # RoCE-sized packets: 2 MiB, not 128 KiB
    assert default_slots(1432, 65464) == 1462        # one frame at MTU 1500
    assert default_slots(8, 65464) == 65536          # at most 65536 (--slots' range)
