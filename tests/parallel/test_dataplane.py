"""The native data plane end to end: a real netreduce-switch daemon, N rank
processes, all-reduces checked element by element."""
from __future__ import annotations

import itertools
import uuid

import numpy as np
import pytest

from netreduce.worker import dataplane
from tests.parallel.ranks import rank_barrier, rounds_of_sums, run_ranks

PAYLOAD = 65464  # the daemon's default payload bytes
F32_PER_PACKET = PAYLOAD // 4
SIZES = [0, 1, F32_PER_PACKET - 1, F32_PER_PACKET + 1, 10**6 + 3]


def _job() -> str:
    return "test-" + uuid.uuid4().hex[:8]


def _rank_pattern(rank, size, address, job, sizes, kw):
    """Rank r contributes r: every element must come back as N(N-1)/2."""
    with dataplane.connect(address, job, rank, size, timeout=20.0, **kw) as conn:
        for count in sizes:
            a = np.full(count, rank, dtype=np.float32)
            out = conn.allreduce(a)
            assert out is a
            bad = np.flatnonzero(a != size * (size - 1) / 2)
            assert bad.size == 0, f"count {count}: {bad.size} wrong elements, first at {bad[:5]}"
        return conn.stats()


@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
def test_rank_sum_every_world_size(switch, size):
    run_ranks(_rank_pattern, size, switch.address, _job(), SIZES, {})


@pytest.mark.slow
def test_64_mib_two_ranks(switch):
    run_ranks(_rank_pattern, 2, switch.address, _job(), [16 * 2**20], {})


def _indexed(rank, size, address, job, count, kw):
    """Element i of rank r is (i mod 4099) + r: a chunk landing at the wrong offset, or
    a header sent with another chunk's payload, shows up (constant data would hide it)."""
    with dataplane.connect(address, job, rank, size, timeout=60.0, **kw) as conn:
        pattern = (np.arange(count, dtype=np.int64) % 4099).astype(np.float32)
        a = pattern + np.float32(rank)
        conn.allreduce(a)
        a -= pattern * size + np.float32(size * (size - 1) / 2)
        bad = np.flatnonzero(a)
        assert bad.size == 0, f"{bad.size} wrong elements, first at {bad[:5]}"


@pytest.mark.slow
def test_256_mib_two_ranks_index_dependent(switch):
    # "hundreds of MiB" (issue 2): 256 MiB of float32, ~4100 jumbo packets per rank
    run_ranks(_indexed, 2, switch.address, _job(), 64 * 2**20, {})


def test_a_large_message_of_8_kib_chunks_lands_exactly():
    # 8936-byte payloads (MTU 9000's) and a message past 16 MiB: results reach dst by
    # streaming stores (engine/prefetch.h), whole lines only, chunk edges plain; an odd
    # length leaves a short last chunk.
    from netreduce.switch import spawn

    with spawn(payload_bytes=8936) as sw:
        run_ranks(_indexed, 2, sw.address, _job(), 5 * 2**20 + 3, {})


def _data(dtype, seed, count):
    rng = np.random.default_rng(seed)
    if dtype in ("int32", "int64"):
        return rng.integers(-1000, 1000, count).astype(dtype)
    if dtype == "bfloat16":  # bfloat16 bits: float32's top half, exact small values
        return (rng.integers(-64, 64, count).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return (rng.standard_normal(count) * 10).astype(dtype)


def _as_float(a, dtype):
    if dtype == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a


def _reference(dtype, op, arrays):
    vals = [_as_float(a, dtype).astype(np.float64 if dtype != "int64" else np.int64) for a in arrays]
    if op == "sum":
        if dtype in ("int32",):
            return np.sum([a.astype(np.int64) for a in arrays], axis=0).astype(np.int32)
        return np.sum(vals, axis=0)
    return (np.min if op == "min" else np.max)(vals, axis=0)


DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64"]
CASES = list(itertools.product(DTYPES, ["sum", "min", "max"]))


def _random_cases(rank, size, address, job, count):
    digests = []
    with dataplane.connect(address, job, rank, size, timeout=20.0) as conn:
        for case, (dtype, op) in enumerate(CASES):
            mine = _data(dtype, 1000 * case + rank, count)
            conn.allreduce(mine, op=op, dtype="bfloat16" if dtype == "bfloat16" else None)
            ref = _reference(dtype, op, [_data(dtype, 1000 * case + r, count) for r in range(size)])
            got = _as_float(mine, dtype)
            if dtype.startswith("int") or op != "sum":
                np.testing.assert_array_equal(got, ref.astype(got.dtype), err_msg=f"{dtype} {op}")
            else:
                rtol = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1e-2}[dtype]
                np.testing.assert_allclose(got.astype(np.float64), ref, rtol=rtol, atol=rtol,
                                           err_msg=f"{dtype} {op}")
            digests.append(mine.tobytes().hex()[:64] + str(hash(mine.tobytes())))
    return digests


def test_every_dtype_and_op_against_numpy(switch):
    # 3 ranks, a count that is not a multiple of any packet size.
    results = run_ranks(_random_cases, 3, switch.address, _job(), 40_003)
    # The aggregator computes each element once: every rank holds the same bits.
    assert results[0] == results[1] == results[2]


# The drop knob's coin (mt19937_64, engine/message_chunks.cc) seeded so that each rank
# drops one of its first 12 packets and neither of the first two: message 1's chunk
# (and its tail copy, if made) goes, and a chunk among message 2's first 11, never a
# tail, is lost, so every rank must resend. With random seeds a rank that lost nothing
# (0.95^64: 1 rank in 27) resends only if its timer beats the loser's resend, which a
# loaded host decides (it failed at load 10-12).
DROP_SEEDS = (1, 2, 4)  # first drop at the 4th, 9th and 8th packet


def _seeded_pattern(rank, size, address, job, sizes, kw):
    return _rank_pattern(rank, size, address, job, sizes, dict(kw, seed=DROP_SEEDS[rank]))


def test_engine_drop_knob_still_exact(switch):
    stats = run_ranks(_seeded_pattern, 3, switch.address, _job(), [1, 10**6 + 3, 1000],
                      {"drop_rate": 0.05, "retransmit_ms": 5.0})
    assert sum(s["dropped_by_knob"] for s in stats) > 0
    assert all(s["retransmits"] > 0 for s in stats)


def test_roce_sized_packets():
    """A 4 KiB payload pool: standard RoCE-sized packets carrying a verified ICRC."""
    from netreduce.switch import spawn

    with spawn(payload_bytes=4096, slots=64) as sw:
        run_ranks(_rank_pattern, 3, sw.address, _job(), [0, 1, 1023, 1025, 300_001], {})
        from netreduce.protocol.client import ControlClient

        with ControlClient(sw.address) as c:
            g = c.call("counters")["global"]
        assert g["drop_bad_icrc"] == 0 and g["slots_completed"] > 0


def _two_jobs(rank, size, address, jobs, counts, together):
    # Ranks 0..1 are job A (size 2), ranks 2..4 are job B (size 3), running at once:
    # every rank is admitted before any sends (a job that finished and left before the
    # other was admitted would free its job index for it on a loaded machine).
    if rank < 2:
        job, r, n, value = jobs[0], rank, 2, 1.0
    else:
        job, r, n, value = jobs[1], rank - 2, 3, 10.0
    with dataplane.connect(address, job, r, n, timeout=20.0) as conn:
        together.wait(60)
        for count in counts:
            a = np.full(count, value * (r + 1), dtype=np.float64)
            conn.allreduce(a)
            expect = value * n * (n + 1) / 2
            assert (a == expect).all(), f"job {job}: got {a[:3]}, expected {expect}"
        return conn.counters()["jobs"][job]


def test_two_jobs_at_once_do_not_disturb_each_other(switch):
    counters = run_ranks(_two_jobs, 5, switch.address, [_job(), _job()], [10**5, 7, 10**6],
                         rank_barrier(5))
    assert counters[0]["index"] != counters[2]["index"]
    # Nothing of one job reached the other (wrong key, rank, job...). Stale drops are
    # not that: a resend of a slot's previous round that arrives after the slot moved
    # on (needless resends happen when a loaded machine delays a result).
    for c in (counters[0], counters[2]):
        assert c["drops"] - c["drop_stale"] == 0, c


def test_bad_input_is_refused_before_sending(switch):
    with dataplane.connect(switch.address, _job(), 0, 1) as conn:
        with pytest.raises(ValueError, match="C-contiguous"):
            conn.allreduce(np.zeros((4, 4), np.float32)[:, 1])
        with pytest.raises(ValueError, match="cannot all-reduce dtype complex64"):
            conn.allreduce(np.zeros(4, np.complex64))
        with pytest.raises(ValueError, match="does not match"):
            conn.allreduce(np.zeros(4, np.float32), np.zeros(5, np.float32))
        with pytest.raises(ValueError, match="unsupported op"):
            conn.allreduce(np.zeros(4, np.float32), op="prod")
        a = np.arange(10, dtype=np.int64)
        conn.allreduce(a)  # still usable afterwards
        assert (a == np.arange(10)).all()


@pytest.mark.parametrize("payload", [65464, 4096])
def test_multicast_fanout(payload):
    """--fanout multicast: one result packet per slot to the job's group; every rank
    (several on this host, sharing the group port) gets every result."""
    from netreduce.protocol.client import ControlClient
    from netreduce.switch import spawn

    with spawn(fanout="multicast", payload_bytes=payload) as sw:
        run_ranks(_rank_pattern, 3, sw.address, _job(), [0, 1, 10**6 + 3], {})
        run_ranks(_random_cases, 2, sw.address, _job(), 5003)
        with ControlClient(sw.address) as c:
            g = c.call("counters")["global"]
    # one packet out per completed slot (plus any retransmitted result, and the held
    # notices of each rank's first message), not one per rank
    assert g["packets_out"] <= g["slots_completed"] + g["retransmitted_results"] + \
        g["held_notices"]
    assert g["drop_bad_icrc"] == 0


@pytest.mark.parametrize("threads", [1, 2])
def test_auto_fanout_sends_the_group_alone_once_ranks_say_it_reaches_them(threads):
    """--fanout auto where every rank receives the group (one host): results go to
    the group, and a unicast copy only to a rank whose contributions do not yet say
    the group reached it -- its first window's worth, not one per result. With two
    data threads, both send to the group and either may see a rank's bit."""
    from netreduce.protocol.client import ControlClient
    from netreduce.switch import spawn

    with spawn(fanout="auto", payload_bytes=4096, threads=threads) as sw:
        stats = [s for s, _ in run_ranks(rounds_of_sums, 3, sw.address, _job(), 10**6 + 3, 3)]
        with ControlClient(sw.address) as c:
            g = c.call("counters")["global"]
    assert all(s["group_datagrams"] > 0 for s in stats), stats
    # 3 ranks x 2,931 results of 4096 B in 3 rounds; copies for all would be 3 per
    # result. A loaded host adds some: a window again after a second without a group
    # datagram, and a copy marked repeat seen for each needless resend.
    assert 0 < g["group_unicast_copies"] < 2 * g["slots_completed"], g
    assert g["drop_bad_icrc"] == 0


def test_netreduce_info_names_the_fan_out_and_a_jobs_unicast_copies():
    import json
    import subprocess
    import sys
    from netreduce.switch import spawn

    with spawn(fanout="auto", payload_bytes=4096) as sw:
        job = _job()
        with dataplane.connect(sw.address, job, 0, 1) as conn:
            conn.allreduce(np.ones(10_000, np.float32))  # its first window: copies
            where = f"{sw.address[0]}:{sw.address[1]}"
            run = [sys.executable, "-m", "netreduce.cli", "info", "--switch", where]
            text = subprocess.run(run, capture_output=True, text=True, timeout=60)
            data = json.loads(subprocess.run(run + ["--json"], capture_output=True, text=True,
                                             timeout=60).stdout)
    assert text.returncode == 0 and "fan-out: auto" in text.stdout, text
    agg = data["aggregator"]
    assert agg["fanout"] == "auto", agg
    assert 0 < agg["jobs"][job]["group_unicast_copies"] <= agg["jobs"][job]["slots_completed"], agg
    assert "unicast copies for ranks the group did not reach" in text.stdout, text.stdout


def _widening(rank, size, address, job, count):
    """Element i: rank i % 3 sends B, the other two send 1. B + 1 is a tie that rounds
    back to B (to even) in the 16-bit type, so a 16-bit accumulator ends at B whenever
    B arrives first or second, which for any arrival order is 2 elements in 3; in
    float32, B + 2 is exact and representable in 16 bits."""
    mine = np.where(np.arange(count) % size == rank, 1, 0).astype(bool)
    with dataplane.connect(address, job, rank, size, timeout=20.0) as conn:
        f16 = np.where(mine, 2048, 1).astype(np.float16)
        conn.allreduce(f16)
        # bfloat16 (8-bit significand): 256 + 1 ties back to 256; 258 is representable
        bf = (np.where(mine, 256, 1).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        conn.allreduce(bf, dtype="bfloat16")
    return f16, (bf.astype(np.uint32) << 16).view(np.float32)


def test_16_bit_floats_accumulate_in_float32(switch):
    # the premise: summing in the 16-bit type loses the ones
    assert np.float16(2048) + np.float16(1) + np.float16(1) == 2048
    results = run_ranks(_widening, 3, switch.address, _job(), 3 * 1000 + 1)
    for f16, bf in results:
        assert (f16 == 2050).all(), np.unique(f16)
        assert (bf == 258).all(), np.unique(bf)


def _out_of_place(rank, size, address, job, counts):
    with dataplane.connect(address, job, rank, size, timeout=20.0) as conn:
        for count in counts:
            src = np.arange(count, dtype=np.float64) + rank
            before = src.copy()
            dst = np.full(count, np.nan)
            assert conn.allreduce(src, dst) is dst
            np.testing.assert_array_equal(src, before, err_msg=f"count {count}: source changed")
            np.testing.assert_array_equal(dst, size * np.arange(count) + size * (size - 1) / 2,
                                          err_msg=f"count {count}")


def test_result_into_another_buffer_leaves_the_source_alone(switch):
    # one element, and several packets of float64 (8183 per 64 KiB packet)
    run_ranks(_out_of_place, 3, switch.address, _job(), [1, 3 * 8183 + 5])
