"""benchmarks/overlap_step.py's environment variants (MODE%VARIANT: one process-wide
setting, such as glibc's malloc tunables, in every mode's ranks alike) and the ranks'
page faults beside their CPU (benchmarks/common.py's sampler)."""
import os
import time

import pytest

from benchmarks import common, overlap_step

NT = "nt:MALLOC_MMAP_THRESHOLD_=33554432,MALLOC_TRIM_THRESHOLD_=1073741824"


def test_variants_and_labels_parse():
    assert overlap_step.parse_variants([NT, "pad:MALLOC_TOP_PAD_=1"]) == {
        "nt": {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1073741824"},
        "pad": {"MALLOC_TOP_PAD_": "1"}}
    for bad in ("nt", "nt:", "nt:K", ":K=V", "nt:=V"):
        with pytest.raises(SystemExit):
            overlap_step.parse_variants([bad])
    assert overlap_step.parse_label("nr-ddp") == ("nr-ddp", "", "")
    assert overlap_step.parse_label("nr-ddp@base") == ("nr-ddp", "base", "")
    assert overlap_step.parse_label("ddp-gloo%nt") == ("ddp-gloo", "", "nt")
    assert overlap_step.parse_label("nr-ddp@base%nt") == ("nr-ddp", "base", "nt")
    assert overlap_step.plain_label("nr-ddp@base%nt") == "nr-ddp@base"


def test_unknown_variant_or_mode_is_refused():
    with pytest.raises(SystemExit):
        overlap_step.main(["torch", "--modes", "nr-ddp%nt", "--runs", "0"])
    with pytest.raises(SystemExit):
        overlap_step.main(["torch", "--modes", "nr-dpp", "--runs", "0"])


def _mode(step, cpu, img=None):
    return {"img_per_s": img, "phases": {"forward": 0.1, "backward": 0.2, "update": 0.05,
                                         "step": step},
            "machine_cpu": {"ranks_cpu_s_per_step": cpu}}


def test_a_variant_is_read_against_its_own_mode_and_its_own_peers():
    results = {"compute": _mode(0.30, 0.56), "compute%nt": _mode(0.27, 0.50),
               "ddp-gloo": _mode(0.80, 1.00, 5.0), "ddp-gloo%nt": _mode(0.78, 0.96, 5.2),
               "nr-hvd": _mode(0.58, 0.88, 7.0), "nr-hvd%nt": _mode(0.55, 0.84, 7.4),
               "nr-ddp": _mode(0.60, 0.90, 6.8), "nr-ddp%nt": _mode(0.56, 0.85, 7.2)}
    run = overlap_step.ratios(results, list(results), s_bytes=46_760_000, rate=1e9)
    # each MODE%nt over the same mode without it, in the same run
    assert run["nr-ddp%nt_step_vs_plain"] == round(0.56 / 0.60, 4)
    assert run["nr-ddp%nt_cpu_vs_plain"] == round(0.85 / 0.90, 4)
    assert run["ddp-gloo%nt_cpu_vs_plain"] == round(0.96 / 1.00, 4)
    assert run["compute%nt_step_vs_plain"] == round(0.27 / 0.30, 4)
    # the variant's netreduce modes against the variant's gloo and hvd, not the plain ones
    assert run["nr-hvd%nt_vs_gloo"] == round(7.4 / 5.2, 4)
    assert run["nr-ddp%nt_speed_vs_gloo"] == round(0.78 / 0.56, 4)
    assert run["nr-ddp%nt_speed_vs_nr-hvd"] == round(0.55 / 0.56, 4)
    assert run["nr-ddp_speed_vs_nr-hvd"] == round(0.58 / 0.60, 4)
    # and against the bound from the variant's own compute mode
    bound_nt = run["bounds"]["compute%nt"]["bound_s"]
    assert run["nr-ddp%nt_step_vs_bound"] == round(0.56 / bound_nt, 4)
    assert run["nr-ddp_step_vs_bound"] == round(0.60 / run["bound"]["bound_s"], 4)
    assert "nr-ddp_step_vs_plain" not in run


def _sampled_after(sampler, t_us):
    """Until the sampler's thread has taken a sample at or after ``t_us``: a loaded
    host may not run that thread for longer than any sleep here (it failed at load 13
    when the first sample inside the window came after the pages were touched)."""
    deadline = time.monotonic() + 60.0
    while not any(s[0] >= t_us for s in list(sampler.samples)):
        assert time.monotonic() < deadline, "the sampler took no sample in 60 s"
        time.sleep(0.005)


def test_ranks_minor_faults_are_sampled_beside_their_cpu():
    cpu, faults = common.pid_cpu_and_faults(os.getpid())
    assert cpu > 0 and faults > 0
    sampler = common.MachineCPUSampler(interval_s=0.01)
    sampler.watch("ranks", os.getpid())
    with sampler:
        t0 = time.time_ns() / 1000.0
        _sampled_after(sampler, t0)  # one sample inside the window before the faults
        pages = bytearray(64 << 20)  # 64 MiB, zeroed: each 4 KiB page touched once
        pages[::4096] = b"\1" * len(pages[::4096])
        touched = time.time_ns() / 1000.0
        _sampled_after(sampler, touched)  # and one after them
        t1 = time.time_ns() / 1000.0
    w = sampler.window(t0, t1)
    # 16384 pages of 4 KiB; 32 of 2 MiB where transparent huge pages are always on
    assert w is not None and w["ranks_minflt"] >= 32
    del pages


@pytest.mark.parametrize("modes", [["a", "b"], ["a", "b", "c"], ["a", "b", "c", "d"]])
def test_alternate_runs_every_pair_of_modes_in_either_order_alike(modes):
    """--alternate: over 2 x len(modes) runs, each mode runs first as often as any
    other, and for any two modes each runs before the other in half the runs (with
    two modes the old order, a rotation taken backwards, put the same mode first in
    every run)."""
    runs = [overlap_step.run_order(modes, i, True) for i in range(2 * len(modes))]
    assert all(sorted(r) == sorted(modes) for r in runs)
    firsts = [r[0] for r in runs]
    assert all(firsts.count(m) == 2 for m in modes), firsts
    for a in modes:
        for b in modes:
            if a != b:
                ahead = sum(r.index(a) < r.index(b) for r in runs)
                assert ahead == len(modes), (a, b, runs)


def test_without_alternate_each_run_rotates_by_one():
    assert [overlap_step.run_order(["a", "b", "c"], i, False) for i in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
