"""horovodrun's flags on netreduce-run: the tuning ones set netreduce's knobs, and
docs/horovodrun.md covers every flag of netreduce-run's table and, where horovodrun
is installed, every flag horovodrun itself has."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from netreduce.launcher import command, horovod_flags

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "horovodrun.md")


def _doc() -> str:
    with open(DOC) as f:
        return f.read()


def test_tuning_flags_set_knobs():
    parser, _ = command.build_parser()
    args = parser.parse_args(["-np", "2", "--fusion-threshold-mb", "0", "--cycle-time-ms", "2.5",
                              "--hierarchical-allreduce", "--gloo-timeout-seconds", "9",
                              "--no-stall-check", "--gloo", "true"])
    assert horovod_flags.knobs(args) == {"NETREDUCE_FUSION_THRESHOLD": "0",
                                         "NETREDUCE_CYCLE_TIME": "2.5",
                                         "NETREDUCE_ALGORITHM": "hierarchical",
                                         "NETREDUCE_TIMEOUT": "9.0"}
    assert horovod_flags.notes(args) == [
        "netreduce-run: --no-stall-check has no effect: netreduce always warns of a stall; "
        "raise --stall-check-warning-time-seconds instead"]
    args = parser.parse_args(["-np", "2", "--fusion-threshold-mb", "3", "--no-hierarchical-allreduce",
                              "true"])
    assert horovod_flags.knobs(args) == {"NETREDUCE_FUSION_THRESHOLD": str(3 << 20),
                                         "NETREDUCE_ALGORITHM": "flat"}
    with pytest.raises(SystemExit):
        parser.parse_args(["-np", "2", "--autotune", "true"])  # refused, not ignored


def test_the_page_names_every_flag_netreduce_run_takes():
    doc = _doc()
    parser, _ = command.build_parser()
    flags = {s for a in parser._actions for s in a.option_strings}
    ours = {"--switch", "--job", "--switch-arg", "--no-prefix"}  # netreduce-run's own
    missing = sorted(f for f in flags - ours if f"`{f}" not in doc)
    assert missing == [], missing


@pytest.mark.skipif(shutil.which("horovodrun") is None, reason="horovodrun is not installed")
def test_the_page_names_every_horovodrun_flag():
    out = subprocess.run(["horovodrun", "--help"], capture_output=True, text=True, timeout=120).stdout
    flags = set()
    for line in out.split("options:", 1)[1].splitlines():  # an option's own line only
        m = re.match(r"^  (-\S.*?)(?:\s{2,}|$)", line)
        if m:
            flags |= set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", m.group(1)))
    missing = sorted(f for f in flags if f"`{f}" not in _doc())
    assert len(flags) > 50 and missing == [], missing
