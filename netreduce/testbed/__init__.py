"""Emulated multi-host testbed on one Linux machine (root only): network namespaces on
a bridge, rate-limited veth links, random loss. See docs/testbed.md.

    from netreduce.testbed import Testbed
    with Testbed(hosts=4, rate="1gbit") as tb:
        tb.run(0, ["ip", "addr"])
"""
from netreduce.testbed.plan import (AGGREGATOR, NS_IFNAME, Node, Plan, TestbedError,  # noqa: F401
                                    format_rate, make_plan, parse_rate)
from netreduce.testbed.proc_stat import cpu_seconds as process_cpu_seconds  # noqa: F401
from netreduce.testbed.sh import why_unusable  # noqa: F401
from netreduce.testbed.testbed import SwitchHandle, Testbed, leftovers, teardown  # noqa: F401
