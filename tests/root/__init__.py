import ipaddress
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Dict, List


def scratch_testbed_name(tag: str) -> str:
    """A testbed name of this test run only (the tests pass replace=True, which must
    never tear down a testbed someone else brought up): 'n' + 5 hex digits of the
    pid + a one-letter tag, 7 characters within the 9 the interface names allow."""
    return f"n{os.getpid() & 0xFFFFF:05x}{tag}"


# The /24s scratch_subnet hands out: 10.78.16.0/24 up to 10.78.199.0/24 (every
# testbed of tests/root takes one; benchmarks and helpers use other 10.x ranges).
_FIRST, _COUNT = 16, 184
_taken: set = set()


def scratch_subnet() -> str:
    """A /24 for one testbed of this test run only. A testbed's bridge address (.254)
    lives in the root namespace, so two runs of tests/root at once (two checkouts, a
    rehearsal beside a helper's loop) that bring up the same /24 break each other's
    routes; the names are per run already (scratch_testbed_name). Starts at an offset
    from the pid, skips every /24 the root namespace has an address in (another run's
    bridge, a leftover) and those this run took before (a failed test's testbed cannot
    collide with the next)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    used = [ipaddress.ip_interface(line.split()[3]).network for line in out.splitlines()
            if len(line.split()) > 3]
    start = (os.getpid() * 37) % _COUNT
    for fresh_only in (True, False):  # past _COUNT testbeds in one run: reuse what is down
        for i in range(_COUNT):
            net = ipaddress.ip_network(f"10.78.{_FIRST + (start + i) % _COUNT}.0/24")
            if any(net.overlaps(u) for u in used) or (fresh_only and net in _taken):
                continue
            _taken.add(net)
            return str(net)
    raise RuntimeError("no free /24 in 10.78.16.0-10.78.199.0 for a scratch testbed")


def wait_for_capture_file(pcap: Path, timeout: float) -> None:
    """Wait until a capture tool (tshark, dumpcap) has written its file's header --
    under load it takes seconds to start -- then a moment more: the header is written
    a little before the filter is live."""
    deadline = time.monotonic() + timeout
    while not (pcap.exists() and pcap.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pcap.exists(), f"no capture file {pcap} within {timeout:g} s"
    time.sleep(1.0)


LOSS_WORKER = str(Path(__file__).resolve().parents[2] / "benchmarks" / "loss.py")


def loss_worker_reports(tb, switch, hosts: int, n: int, max_elems: int, seed: int,
                        env: Dict[str, str]) -> List[dict]:
    """benchmarks/loss.py's worker on testbed hosts 0..hosts-1, one rank each, in a job
    of its own at ``switch``: N all-reduces of up to MAX_ELEMS elements (SEED's), 60 s
    per call; each rank's report (tests.procs.collect_ok)."""
    from tests.procs import collect_ok
    host, port = switch.address
    job = "loss-" + uuid.uuid4().hex[:6]
    procs = [tb.popen(r, [sys.executable, LOSS_WORKER, "worker", host, str(port), job, str(r),
                          str(hosts), "--n", str(n), "--max-elems", str(max_elems),
                          "--seed", str(seed), "--timeout", "60"],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(hosts)]
    return collect_ok(procs, timeout=300)
