"""setup.py notices that what the native build found changed since the last build in
build/ (issue 35: `pip install .` again after installing libibverbs-dev reused the
build and silently left the verbs transport out, `netreduce info`: transports udp):
its configuration is recorded beside the objects, and a change forces every native
source to be compiled again, saying why."""
from __future__ import annotations

import json
import runpy
from pathlib import Path

SETUP = Path(__file__).resolve().parent.parent.parent / "setup.py"


def _setup() -> dict:
    return runpy.run_path(str(SETUP), run_name="netreduce_setup")  # setup() not run


def test_a_library_found_since_the_last_build_forces_a_rebuild_and_says_why(tmp_path):
    s = _setup()
    stamp = str(tmp_path / "build" / "netreduce_native_config.json")
    config = s["native_config"](["native/a.cc"])
    without = dict(config, verbs=False, xdp=False, crc32="zlib")
    assert "no record" in s["config_changed"](stamp, without)  # a build before the record
    assert s["config_changed"](stamp, without) is None         # the same again: reuse
    why = s["config_changed"](stamp, dict(without, verbs=True, sources=["native/a.cc",
                                                                        "native/verbs.cc"]))
    assert "the verbs transport (libibverbs-dev) found" in why and "sources changed" in why
    assert json.loads(Path(stamp).read_text())["verbs"] is True
    why = s["config_changed"](stamp, dict(without, verbs=True, sources=["native/a.cc",
                                                                        "native/verbs.cc"],
                                          crc32="isal"))
    assert why == "since the last build, the ICRC's CRC-32 library: zlib -> isal"


def test_the_build_records_what_it_found():
    config = _setup()["native_config"]()
    assert set(config) == {"verbs", "xdp", "crc32", "sources", "folders", "python"}
    assert any(src.endswith("aggregator.cc") for src in config["sources"])
