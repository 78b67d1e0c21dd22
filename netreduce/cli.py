"""``netreduce`` command: ``netreduce info`` prints what this installation is and how
it is configured — version, native build features, the rank this environment would
get, and every NETREDUCE_* knob with its value and where the value came from; with
an aggregator (NETREDUCE_SWITCH or --switch), what this host's path to it carries
(``probe``); with failover on, what the running job runs on now."""
from __future__ import annotations

import argparse
import json
import platform
import sys
from typing import Any, Dict, Optional, Sequence

import numpy as np

import netreduce
from netreduce import config, environment
from netreduce.errors import ControlPlaneError
from netreduce.protocol import auth, codec, messages
from netreduce.protocol.address import format_address, parse_address, resolve
from netreduce.protocol.client import ControlClient
from netreduce.protocol.socket_buffers import receive_buffer_note, size_words
from netreduce.worker import job_status
from netreduce.worker.job_paths import describe_config


def _native_info() -> Dict[str, Any]:
    try:
        from netreduce import _native
    except ImportError as exc:
        return {"built": False, "error": str(exc)}
    info: Dict[str, Any] = {"built": True, "path": getattr(_native, "__file__", "?")}
    build_info = getattr(_native, "build_info", None)
    if build_info is not None:
        info.update(dict(build_info()))
    data_path = getattr(_native, "udp_data_path", None)
    if data_path is not None:  # what this host's data sockets get (NETREDUCE_UDP_OFFLOAD)
        try:
            info["data_path"] = data_path(config.get("NETREDUCE_UDP_OFFLOAD"))
        except (ValueError, RuntimeError) as exc:
            info["data_path"] = f"<unavailable: {exc}>"
    receive_buffer = getattr(_native, "udp_receive_buffer", None)
    if receive_buffer is not None:  # what a rank's socket may hold here (SO_RCVBUF)
        try:
            got = int(receive_buffer(config.get("NETREDUCE_UDP_OFFLOAD"))[0])
            asked = int(_native.engine_receive_buffer_asked)
            note = receive_buffer_note(got, asked, "a rank here")
            info["receive_buffer"] = note or f"{size_words(got / 2)} (as asked)"
        except (ValueError, RuntimeError) as exc:
            info["receive_buffer"] = f"<unavailable: {exc}>"
    return info


def probe(text: str, what: str = "NETREDUCE_SWITCH", timeout: float = 2.0) -> Dict[str, Any]:
    """What `netreduce info` says about an aggregator address: how it parses and
    resolves, the path MTU from this host and the payload that path carries, and,
    when the aggregator answers, each of its jobs' payload and why it was chosen."""
    out: Dict[str, Any] = {"given": text}
    try:
        address = parse_address(text, what=what)
        out["address"] = format_address(address)
        address = resolve(address)
        out["resolved"] = address[0]
    except ValueError as exc:
        out["error"] = str(exc)
        return out
    try:
        from netreduce import _native
        mtu, ipv6 = _native.path_mtu(*address)
    except (ImportError, ValueError, RuntimeError) as exc:
        out["path_error"] = str(exc)
    else:
        payload = _native.payload_for_mtu(mtu, ipv6)
        out.update(path_mtu=mtu, ipv6=ipv6, payload_bytes=payload,
                   payload_reason=f"payload {payload} B: path MTU {mtu} from this host toward "
                                  f"{address[0]} (unless the aggregator's --payload-bytes or "
                                  "another rank's path is smaller)")
    try:
        # aggregator=True: an address named on the command line is an aggregator's, so
        # TLS with NETREDUCE_TLS_CA even when it is not among this host's knobs.
        with ControlClient(address, timeout=timeout, aggregator=True) as client:
            counters = codec.to_builtins(client.request(messages.Counters(), timeout=timeout))
    except ControlPlaneError as exc:
        out["unreachable"] = str(exc)
        return out
    out["fanout"] = counters.get("fanout", "unicast")
    out["jobs"] = {name: {k: job.get(k) for k in ("size", "ranks", "payload_bytes",
                                                   "payload_reason", "slots_completed",
                                                   "group_unicast_copies", "epoch", "resizes",
                                                   "drop_bad_source", "finished")}
                   for name, job in counters.get("jobs", {}).items()}
    # Contributions from addresses no rank registered (docs/operations.md, *Security*).
    out["drop_bad_source"] = counters.get("global", {}).get("drop_bad_source", 0)
    if counters.get("hidden_jobs"):  # jobs with a secret: the operator's to read
        out["hidden_jobs"] = counters["hidden_jobs"]
    return out


def collect(switch: Optional[str] = None) -> Dict[str, Any]:
    try:
        topo = environment.discover()
        rank = {"launcher": topo.launcher, "rank": topo.rank, "size": topo.size,
                "local_rank": topo.local_rank, "local_size": topo.local_size, "job": topo.job,
                "job_problem": environment.job_problem(topo)}
    except ValueError as exc:
        rank = {"error": str(exc)}
    knobs = {}
    for name, knob in config.KNOBS.items():
        try:
            value: Any = config.get(name)
        except ValueError as exc:
            value = f"<invalid: {exc}>"
        if knob.secret and value:
            value = "<set, hidden>"
        knobs[name] = {"value": value, "default": knob.default, "source": config.source(name),
                       "help": knob.help}
    data = {"version": netreduce.__version__, "python": platform.python_version(),
            "numpy": np.__version__, "native": _native_info(), "environment": rank,
            "knobs": knobs}
    try:
        address = switch or config.get("NETREDUCE_SWITCH")
    except ValueError:
        address = ""
    if address:  # the payload this host's path gives, and what the aggregator chose
        data["aggregator"] = probe(address, what="--switch" if switch else "NETREDUCE_SWITCH")
    data["failover"] = describe_config()  # docs/failover.md
    if data["failover"].startswith("on") and "job" in rank:  # the running job, from rank 0
        data["job_status"] = job_status.query(config.snapshot(), rank["job"],
                                              auth.job_secret())
    return data


def _print_aggregator(agg: Dict[str, Any], w: Any) -> None:
    w(f"aggregator: {agg.get('address', agg['given'])}")
    if "error" in agg:
        w(f": error: {agg['error']}\n")
        return
    literal = parse_address(agg["address"])[0]  # "[::1]:4791" -> "::1"
    w(f" ({agg['resolved']})\n" if agg["resolved"] != literal else "\n")
    if "path_mtu" in agg:
        w(f"  this host: {agg['payload_reason']}\n")
    else:
        w(f"  this host: no path MTU: {agg.get('path_error')}\n")
    if "unreachable" in agg:
        w(f"  not reachable: {agg['unreachable']}\n")
        return
    fanout = agg.get("fanout", "unicast")
    w(f"  fan-out: {fanout}\n")
    if agg.get("drop_bad_source"):
        w(f"  {agg['drop_bad_source']} packets dropped as from an address no rank registered "
          "(bad_source: a replay or a misrouted rank; docs/operations.md, Security)\n")
    if not agg["jobs"]:
        w("  no jobs admitted\n")
    for name, job in agg["jobs"].items():
        state = "finished; " if job.get("finished") else ""
        w(f"  job '{name}' ({state}{len(job['ranks'] or [])} of {job['size']} ranks): "
          f"{job['payload_reason']}\n")
        if job.get("epoch"):  # an elastic job (switch/epochs.py)
            w(f"    membership epoch {job['epoch']}, resized {job.get('resizes') or 0} "
              f"time(s)\n")
        if job.get("drop_bad_source"):
            w(f"    {job['drop_bad_source']} of its packets came from an address none of its "
              "ranks registered (bad_source)\n")
        if job.get("fanout_reason"):  # --fanout segment: this job's choice
            w(f"    fan-out {job['fanout_reason']}\n")
        if fanout in ("auto", "segment"):  # ranks outside the group: ~one copy per result each
            w(f"    {job.get('group_unicast_copies') or 0} unicast copies for ranks the group "
              f"did not reach, of {job.get('slots_completed') or 0} results\n")


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
        if env.get("job_problem"):
            w(f"  job name: {env['job_problem']}\n")
    if "aggregator" in info:
        _print_aggregator(info["aggregator"], w)
    if "failover" in info:
        w(f"failover: {info['failover']}\n")
    if "job_status" in info:
        w(f"  now: {job_status.describe(info['job_status'])}\n")
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
    info.add_argument("--switch", metavar="HOST[:PORT]",
                      help="aggregator to describe (default: NETREDUCE_SWITCH): the path MTU "
                           "and payload from this host, and each admitted job's payload and why")
    key = sub.add_parser("job-key", help="the public key a job's secret gives its name: a line "
                         "for netreduce-switch --job-secrets (pre-registers the name without "
                         "giving the daemon the secret)")
    key.add_argument("job", help="the job's name (NETREDUCE_JOB on its ranks)")
    args = parser.parse_args(argv)
    if args.command == "job-key":
        from netreduce.errors import NetReduceError
        try:
            secret = auth.job_secret()
        except NetReduceError as exc:
            parser.error(str(exc))
        if not secret:
            parser.error("no job secret: set NETREDUCE_JOB_SECRET or NETREDUCE_JOB_SECRET_FILE "
                         "to the secret the job's ranks will have")
        print(f"{args.job} ed25519:{auth.public_key(secret, args.job)}")
        return 0
    if args.command == "info":
        data = collect(args.switch)
        if args.json:
            json.dump(data, sys.stdout, indent=2, default=str)
            sys.stdout.write("\n")
        else:
            print_info(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
