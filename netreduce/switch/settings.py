"""The aggregator's settings and their defaults, declared once.

netreduce-switch's flags (daemon.py) take their defaults from ``DEFAULTS``; the
aggregator a rank hosts (in_process.py), the fuzzers and tests build theirs with
``aggregator_args``. The binding (native/python/bindings.cc) takes every setting from
its caller and holds no default of its own; aggregator.h's (what C++ callers get) are
kept equal to these by tests/unit/test_native_surface.py. One name per setting, from
the binding to the native field (``AggregatorConfig``); the flags spell them
``--max-jobs``, ``--fanout``, ... (``--memory-mb`` is ``memory_limit`` in MiB,
``--multicast-base`` is ``group_base``)."""
from __future__ import annotations

from typing import Any, Dict

from netreduce import config
from netreduce.protocol.address import DEFAULT_PORT

# The largest payload the wire carries (wire::kMaxPayload, netreduce._native.MAX_PAYLOAD):
# the --payload-bytes cap when none is given.
MAX_PAYLOAD = 65464

DEFAULTS: Dict[str, Any] = dict(
    host="0.0.0.0",          # the control port's and the data ports' address
    port=DEFAULT_PORT,       # TCP control port = first UDP data port (4791, RoCEv2's)
    slots=32,                # per job at payload_bytes: 32 x 64 KiB = 2 MiB in flight
    payload_bytes=MAX_PAYLOAD,
    max_jobs=16,
    threads=1,               # data threads, one UDP port each
    memory_limit=1 << 30,    # bytes of slot memory over all jobs
    fanout="segment",        # unicast | multicast | auto | segment (native/common/fanout.h)
    group_base="239.78.0.0",  # job J's results go to group BASE + J
    transport="udp",         # udp | xdp
    xdp_device="",           # "" = the device holding host
    xdp_mode="auto",         # auto | native | generic
    xdp_fallback=True,       # kernel sockets when AF_XDP cannot be had
    data_nice=0,             # the data threads' nice (< 0 needs CAP_SYS_NICE, else unchanged)
)


def aggregator_args(**overrides: Any) -> Dict[str, Any]:
    """Keyword arguments for ``netreduce._native.Aggregator``: ``DEFAULTS``, this
    process's NETREDUCE_UDP_OFFLOAD and NETREDUCE_ICRC_CHECK, then ``overrides``."""
    args = dict(DEFAULTS, udp_offload=config.get("NETREDUCE_UDP_OFFLOAD"),
                icrc_check=config.get("NETREDUCE_ICRC_CHECK"))
    args.update(overrides)  # a misspelt one reaches the binding, which names it
    return args
