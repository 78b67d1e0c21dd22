"""``netreduce`` command: ``netreduce info`` prints what this installation is and how
it is configured — version, native build features, the rank this environment would
get, and every NETREDUCE_* knob with its value and where the value came from."""
from __future__ import annotations

import argparse
import json
import platform
import sys
from typing import Any, Dict, Optional, Sequence

import numpy as np

import netreduce
from netreduce import config, environment


def _native_info() -> Dict[str, Any]:
    try:
        from netreduce import _native
    except ImportError as exc:
        return {"built": False, "error": str(exc)}
    info: Dict[str, Any] = {"built": True, "path": getattr(_native, "__file__", "?")}
    build_info = getattr(_native, "build_info", None)
    if build_info is not None:
        info.update(dict(build_info()))
    return info


def collect() -> Dict[str, Any]:
    try:
        topo = environment.discover()
        rank = {"launcher": topo.launcher, "rank": topo.rank, "size": topo.size,
                "local_rank": topo.local_rank, "local_size": topo.local_size, "job": topo.job}
    except ValueError as exc:
        rank = {"error": str(exc)}
    knobs = {}
    for name, knob in config.KNOBS.items():
        try:
            value: Any = config.get(name)
        except ValueError as exc:
            value = f"<invalid: {exc}>"
        knobs[name] = {"value": value, "default": knob.default, "source": config.source(name),
                       "help": knob.help}
    return {"version": netreduce.__version__, "python": platform.python_version(),
            "numpy": np.__version__, "native": _native_info(), "environment": rank,
            "knobs": knobs}


def print_info(info: Dict[str, Any], out: Optional[Any] = None) -> None:
    w = (out or sys.stdout).write
    w(f"netreduce {info['version']} (python {info['python']}, numpy {info['numpy']})\n")
    native = info["native"]
    if native.get("built"):
        w(f"native module: {native['path']}\n")
        for key, value in native.items():
            if key not in ("built", "path"):
                if isinstance(value, (list, tuple)):
                    value = ", ".join(map(str, value))
                w(f"  {key:<12} {value}\n")
    else:
        w(f"native module: not built ({native['error']})\n")
    env = info["environment"]
    if "error" in env:
        w(f"rank discovery: error: {env['error']}\n")
    else:
        w(f"rank discovery: {env['launcher']}: rank {env['rank']} of {env['size']}, "
          f"local {env['local_rank']} of {env['local_size']}, job '{env['job']}'\n")
    w("knobs (value [source]):\n")
    width = max(len(n) for n in info["knobs"])
    for name, k in info["knobs"].items():
        w(f"  {name:<{width}} = {k['value']!r} [{k['source']}]\n")
        w(f"  {'':<{width}}   {k['help']}\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="netreduce",
                                     description="netreduce: in-network aggregation all-reduce")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="version, build features and every configuration knob")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    if args.command == "info":
        data = collect()
        if args.json:
            json.dump(data, sys.stdout, indent=2, default=str)
            sys.stdout.write("\n")
        else:
            print_info(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
