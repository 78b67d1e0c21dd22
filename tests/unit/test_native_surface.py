"""Each default declared once (issue 34): the binding (native/python/bindings.cc)
takes no default that the Python side declares — a knob in netreduce/config.py or a
netreduce-switch flag (netreduce/switch/settings.py) — and the .pyi repeats no value
(``= ...``). Where the tables meet, they must agree: the .pyi with the binding's
signatures, the native configs' defaults (what C++ callers get) with config.py's
knobs and settings.py, the daemon's flags with settings.py."""
from __future__ import annotations

import ast
import pathlib
import re
from typing import Dict, List, Optional, Tuple

import pytest

from netreduce import config

_native = pytest.importorskip("netreduce._native")
STUB = pathlib.Path(_native.__file__).parent / "_native.pyi"

# (name, has a default, keyword-only) per parameter, self left out
Params = List[Tuple[str, bool, bool]]


def stub_signatures(text: str) -> Dict[str, Params]:
    """'func' or 'Class.method' -> its parameters, from the .pyi."""
    out: Dict[str, Params] = {}

    def params(fn: ast.FunctionDef) -> Params:
        a = fn.args
        pos = a.posonlyargs + a.args
        firsts = [False] * (len(pos) - len(a.defaults)) + [True] * len(a.defaults)
        got = [(p.arg, d, False) for p, d in zip(pos, firsts)]
        got += [(p.arg, d is not None, True) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
        return [p for p in got if p[0] != "self"]

    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = params(node)
        elif isinstance(node, ast.ClassDef):
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and (fn.name == "__init__"
                                                        or not fn.name.startswith("_")):
                    if not any(isinstance(d, ast.Name) and d.id in ("property", "staticmethod")
                               for d in fn.decorator_list):
                        out[f"{node.name}.{fn.name}"] = params(fn)
    return out


def binding_params(doc: Optional[str]) -> Optional[Params]:
    """The parameters pybind11 writes in a callable's first docstring line, e.g.
    "f(self: X, a: int, *, b: str = 'x') -> None"; None for an overloaded one."""
    if not doc or doc.startswith("Overloaded function"):
        return None
    head = doc.splitlines()[0]
    inner = head[head.index("(") + 1:head.rindex(")")]
    parts, depth, cur = [], 0, ""
    for ch in inner:  # split at commas outside brackets and quotes (no quotes hold commas here)
        depth += ch in "[(" and 1 or 0
        depth -= ch in "])" and 1 or 0
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    out, kw_only = [], False
    for part in parts:
        if part == "*":
            kw_only = True
            continue
        name = part.split(":", 1)[0].strip()
        if name != "self":
            out.append((name, " = " in part, kw_only))
    return out


def binding_of(path: str):
    obj = _native
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def test_the_stub_repeats_no_default_value():
    literal = [line.strip() for line in STUB.read_text().splitlines()
               if re.search(r"\w+: [^=#]+ = (?!\.\.\.)", line.split("#")[0])]
    assert not literal, f"write defaults as `= ...` (the binding holds them): {literal}"


def test_the_stub_and_the_binding_have_the_same_parameters():
    checked = 0
    for path, params in stub_signatures(STUB.read_text()).items():
        obj = binding_of(path)
        if obj is None:  # a transport this build lacks (test_wire checks the names)
            continue
        got = binding_params(getattr(obj, "__doc__", None))
        if got is None:
            continue
        assert got == params, (f"{path}: the binding has {got}, the .pyi {params} "
                               "(name, has a default, keyword-only)")
        checked += 1
    assert checked >= 20


def test_the_check_sees_a_parameter_out_of_step():
    doc = "f(self: X, a: int, *, b: str = 'x') -> None\n"
    stub = stub_signatures("class X:\n    def f(self, a: int, *, b: str) -> None: ...\n")
    assert binding_params(doc) == [("a", False, False), ("b", True, True)]
    assert stub["X.f"] == [("a", False, False), ("b", False, True)]  # differs: caught


# The engine's fields that knobs set (dataplane.Connection, algorithms/base.connect_settings).
ENGINE_KNOBS = {"window": "NETREDUCE_WINDOW", "retransmit_ms": "NETREDUCE_RETRANSMIT_MS",
                "timeout_s": "NETREDUCE_TIMEOUT", "drop_rate": "NETREDUCE_DROP_RATE",
                "udp_offload": "NETREDUCE_UDP_OFFLOAD", "icrc_check": "NETREDUCE_ICRC_CHECK"}


def test_the_knob_backed_settings_have_no_binding_default_and_agree_with_config():
    engine = dict((n, d) for n, d, _ in binding_params(_native.Engine.__init__.__doc__))
    aggregator = dict((n, d) for n, d, _ in binding_params(_native.Aggregator.__init__.__doc__))
    for field, knob in ENGINE_KNOBS.items():
        assert engine[field] is False, f"Engine({field}=...) has a default: {knob} holds it"
        assert _native.ENGINE_DEFAULTS[field] == config.KNOBS[knob].default, (field, knob)
    for field in ("udp_offload", "icrc_check"):
        assert _native.AGGREGATOR_DEFAULTS[field] == config.KNOBS[ENGINE_KNOBS[field]].default
    assert not any(aggregator.values()), "the daemon's settings are settings.py's"


def test_the_aggregator_defaults_are_settings_py_s():
    from netreduce.protocol.address import DEFAULT_PORT
    from netreduce.switch import daemon, settings
    native = {k: v for k, v in _native.AGGREGATOR_DEFAULTS.items()
              if k not in ("udp_offload", "icrc_check")}
    assert native == settings.DEFAULTS
    assert settings.MAX_PAYLOAD == _native.MAX_PAYLOAD and DEFAULT_PORT == _native.DEFAULT_PORT
    flags = vars(daemon.build_parser().parse_args([]))
    flags["memory_limit"] = flags.pop("memory_mb") << 20
    for name, value in settings.DEFAULTS.items():
        if name not in ("slots", "payload_bytes"):  # unset: derived per job (daemon.py)
            assert flags[name] == value, name
    assert daemon.default_slots(None, _native.MAX_PAYLOAD) == settings.DEFAULTS["slots"]
