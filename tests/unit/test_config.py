"""Knobs: declared once, typed, with a source; nothing else reads NETREDUCE_*."""
import pathlib
import re

import pytest

from netreduce import config

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_communicator_knob_is_declared():
    for name in ("NETREDUCE_CYCLE_TIME", "NETREDUCE_FUSION_THRESHOLD", "NETREDUCE_STALL_TIMEOUT",
                 "NETREDUCE_TIMELINE", "NETREDUCE_CACHE_CAPACITY", "NETREDUCE_RANK",
                 "NETREDUCE_SIZE", "NETREDUCE_JOB", "NETREDUCE_SWITCH", "NETREDUCE_TIMEOUT"):
        assert name in config.KNOBS and config.KNOBS[name].help


def test_defaults_and_environment(monkeypatch):
    monkeypatch.delenv("NETREDUCE_CYCLE_TIME", raising=False)
    assert config.get("NETREDUCE_CYCLE_TIME") == 1.0
    assert config.source("NETREDUCE_CYCLE_TIME") == "default"
    assert config.get("NETREDUCE_FUSION_THRESHOLD") == 64 * 1024 * 1024
    monkeypatch.setenv("NETREDUCE_CYCLE_TIME", "2.5")
    assert config.get("NETREDUCE_CYCLE_TIME") == 2.5
    assert config.source("NETREDUCE_CYCLE_TIME") == "environment"


@pytest.mark.parametrize("text,value", [("1048576", 1 << 20), ("64M", 64 << 20),
                                        ("64MiB", 64 << 20),
                                        ("1k", 1024), ("2G", 2 << 30), ("0", 0)])
def test_byte_sizes(monkeypatch, text, value):
    monkeypatch.setenv("NETREDUCE_FUSION_THRESHOLD", text)
    assert config.get("NETREDUCE_FUSION_THRESHOLD") == value


def test_invalid_value_names_the_knob(monkeypatch):
    monkeypatch.setenv("NETREDUCE_CACHE_CAPACITY", "lots")
    with pytest.raises(ValueError, match="NETREDUCE_CACHE_CAPACITY='lots'"):
        config.get("NETREDUCE_CACHE_CAPACITY")


def test_declaring_twice_is_an_error():
    with pytest.raises(RuntimeError, match="declared twice"):
        config.declare("NETREDUCE_TIMEOUT", float, 1.0, "again")


def test_no_other_module_reads_the_environment():
    # STYLE.md: no scattered getenv. Launchers' variables (OMPI_*, SLURM_*...) too
    # come through config.launcher_environment().
    for path in [*(ROOT / "netreduce").rglob("*.py"), *(ROOT / "frameworks").rglob("*.py")]:
        if path.name == "config.py":
            continue
        text = path.read_text()
        assert not re.search(r"os\.environ|getenv\(", text), path


def test_launcher_environment_holds_launcher_variables_only(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("NOT_A_LAUNCHER_VARIABLE", "x")
    env = config.launcher_environment()
    assert env["OMPI_COMM_WORLD_RANK"] == "3" and env["MASTER_ADDR"] == "10.0.0.1"
    assert "NOT_A_LAUNCHER_VARIABLE" not in env and "NETREDUCE_TIMEOUT" not in env


def test_setting_a_knob_reaches_get_and_children(monkeypatch):
    # setenv first so that monkeypatch records the variable's original state and
    # restores it (a delenv after set_for_process would record, and later restore,
    # this test's value: every later test in the process would then dial 10.0.0.2)
    monkeypatch.setenv("NETREDUCE_SWITCH", "placeholder")
    config.set_for_process("NETREDUCE_SWITCH", "10.0.0.2:4791")
    assert config.get("NETREDUCE_SWITCH") == "10.0.0.2:4791"
    assert config.child_environment(NETREDUCE_JOB="j")["NETREDUCE_SWITCH"] == "10.0.0.2:4791"
    with pytest.raises(KeyError):
        config.set_for_process("NETREDUCE_NO_SUCH_KNOB", 1)
    with pytest.raises(KeyError):
        config.child_environment(NETREDUCE_NO_SUCH_KNOB=1)
