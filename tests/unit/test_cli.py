"""`netreduce info`: version, build features, every knob with value and source."""
import json
import re

import netreduce
from netreduce import cli, config


def test_info_lists_every_knob_with_value_and_source(capsys, monkeypatch):
    monkeypatch.setenv("NETREDUCE_CYCLE_TIME", "3.5")
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"netreduce {netreduce.__version__}")
    assert "native module:" in out and "rank discovery:" in out
    for name in config.KNOBS:
        assert name in out
    assert "NETREDUCE_CYCLE_TIME       = 3.5 [environment]" in out
    assert "NETREDUCE_FUSION_THRESHOLD = 67108864 [default]" in out


def test_info_json(capsys, monkeypatch):
    monkeypatch.setenv("NETREDUCE_STALL_TIMEOUT", "bogus")
    cli.main(["info", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["version"] == netreduce.__version__
    assert set(data["knobs"]) == set(config.KNOBS)
    assert data["knobs"]["NETREDUCE_TIMEOUT"]["source"] == "default"
    # a bad value is shown, not a crash: info is what a user runs to debug config
    assert data["knobs"]["NETREDUCE_STALL_TIMEOUT"]["value"].startswith("<invalid")
    native = data["native"]
    assert native["built"], native.get("error")  # the suite runs against a built module
    assert native["simd"] in ("avx2+f16c", "generic") and "udp" in native["transports"]
    assert "bfloat16" in native["dtypes"]


def test_info_prints_the_native_build(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "not built" not in out
    simd = re.search(r"^\s+simd\s+(\S+)$", out, re.M)
    assert simd and simd.group(1) in ("avx2+f16c", "generic"), out
    assert re.search(r"^\s+transports\s+udp(, verbs)?(, xdp)?$", out, re.M), out
