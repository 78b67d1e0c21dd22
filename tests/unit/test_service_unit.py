"""docs/netreduce-switch.service stays in step with the daemon: its command line parses
with netreduce-switch's own parser, its reload and stop match netreduce/switch/service.py, and
systemd-analyze accepts it where systemd is installed."""
from __future__ import annotations

import configparser
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from netreduce.switch.daemon import build_parser

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNIT = os.path.join(ROOT, "docs", "netreduce-switch.service")


def _unit() -> configparser.ConfigParser:
    text = open(UNIT).read().replace("\\\n", " ")  # systemd's line continuation
    cp = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#",))
    cp.optionxform = str  # keys are case-sensitive
    cp.read_string(text)
    return cp


def test_exec_start_parses_with_the_daemons_flags():
    argv = shlex.split(_unit()["Service"]["ExecStart"])
    assert os.path.basename(argv[0]) == "netreduce-switch"
    args = build_parser().parse_args(argv[1:])  # SystemExit on an unknown flag
    assert "--payload-bytes" not in argv  # each job's payload follows its path MTU
    assert args.metrics_port is not None
    assert args.log_level == "INFO"


def test_stop_and_reload_match_the_signal_handling():
    svc = _unit()["Service"]
    assert svc["KillSignal"] == "SIGTERM"
    assert "-HUP" in svc["ExecReload"]
    argv = shlex.split(svc["ExecStart"])
    stop_timeout = build_parser().parse_args(argv[1:]).stop_timeout
    assert float(svc["TimeoutStopSec"]) > stop_timeout + 5  # systemd must not SIGKILL a drain


def test_systemd_analyze_verify(tmp_path):
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (Debian: systemd)")
    exe = shutil.which("netreduce-switch") or os.path.join(os.path.dirname(sys.executable),
                                                           "netreduce-switch")
    if not os.path.exists(exe):
        pytest.skip("netreduce-switch is not installed as a command")
    unit = tmp_path / "netreduce-switch.service"
    unit.write_text(open(UNIT).read().replace("/opt/netreduce/bin/netreduce-switch", exe))
    out = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [line for line in (out.stdout + out.stderr).splitlines()
                if "netreduce-switch.service" in line]
    assert out.returncode == 0 and not problems, out.stdout + out.stderr
