"""Running ip/tc/nft and checking that we may: the testbed's only contact with the OS
besides the processes it starts.

Every failure becomes a TestbedError that quotes the command and the tool's own
message, so that a user sees *which* kernel feature or permission is missing."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from typing import List, Optional, Sequence, Set, Tuple

from netreduce.testbed.plan import TestbedError

TOOLS = {
    "ip": "iproute2 (Debian: apt-get install iproute2)",
    "tc": "iproute2 (Debian: apt-get install iproute2)",
    "nft": "nftables (Debian: apt-get install nftables)",
}


def missing_tools(tools: Sequence[str] = ("ip", "tc", "nft")) -> list:
    return [t for t in tools if shutil.which(t) is None]


def why_unusable(tools: Sequence[str] = ("ip", "tc", "nft")) -> Optional[str]:
    """None when this process can build a testbed, else the reason (used both for the
    CLI's error and for pytest's skip message)."""
    if os.geteuid() != 0:
        return ("the netreduce testbed needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create "
                "network namespaces, veth pairs, tc qdiscs and nftables rules; run it as root, "
                "e.g. `sudo netreduce-testbed up ...`")
    missing = missing_tools(tools)
    if missing:
        hints = sorted({TOOLS[t] for t in missing})
        return f"the netreduce testbed needs {', '.join(missing)}: install {'; '.join(hints)}"
    return None


def require_usable(tools: Sequence[str] = ("ip", "tc", "nft")) -> None:
    reason = why_unusable(tools)
    if reason:
        raise TestbedError(reason)


def run(argv: Sequence[str], *, input: Optional[str] = None, check: bool = True,
        timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run one configuration command; raise TestbedError with its stderr on failure."""
    try:
        proc = subprocess.run(list(argv), input=input, capture_output=True, text=True,
                              timeout=timeout)
    except FileNotFoundError:
        raise TestbedError(f"{argv[0]} not found; install {TOOLS.get(argv[0], argv[0])}") from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"`{shlex.join(argv)}` did not finish within {timeout:.0f} s") from None
    if check and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip() or f"exit status {proc.returncode}"
        raise TestbedError(f"`{shlex.join(argv)}` failed: {msg}")
    return proc


def ip(*args: str, netns: Optional[str] = None, check: bool = True) -> subprocess.CompletedProcess:
    pre = ["ip"] + (["-n", netns] if netns else [])
    return run(pre + list(args), check=check)


def tc(*args: str, netns: Optional[str] = None, check: bool = True) -> subprocess.CompletedProcess:
    pre = ["tc"] + (["-n", netns] if netns else [])
    return run(pre + list(args), check=check)


def nft(script: str, *, netns: str) -> subprocess.CompletedProcess:
    return run(["ip", "netns", "exec", netns, "nft", "-f", "-"], input=script)


def list_netns() -> list:
    proc = run(["ip", "netns", "list"], check=False)
    # Lines look like "nrtb-h0 (id: 3)" or just "nrtb-h0".
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def list_links() -> list:
    proc = run(["ip", "-o", "link", "show"], check=False)
    names = []
    for line in proc.stdout.splitlines():
        # "12: nrtb-h0@if11: <BROADCAST,...> ..."
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


NETNS_DIR = "/run/netns"


def netns_ids(namespaces: Sequence[str]) -> Set[Tuple[int, int]]:
    """(device, inode) of each named namespace: what a process inside it shows as
    /proc/PID/ns/net, also after the name is gone."""
    ids = set()
    for ns in namespaces:
        try:
            st = os.stat(os.path.join(NETNS_DIR, ns))
        except OSError:
            continue
        ids.add((st.st_dev, st.st_ino))
    return ids


def _entering(argv: List[bytes], names: Set[str]) -> bool:
    """True for `ip netns exec NAME ...` and `nsenter --net=/run/netns/NAME ...`: a
    process on its way into NAME (it opens the namespace, then enters it, then execs)."""
    if not argv:
        return False
    tool = os.path.basename(argv[0])
    if tool == b"ip" and argv[1:3] == [b"netns", b"exec"] and len(argv) > 3:
        return argv[3].decode(errors="replace") in names
    if tool == b"nsenter":
        return any(a.startswith(b"--net=") and os.path.basename(a[6:]).decode(errors="replace")
                   in names for a in argv[1:])
    return False


def netns_members(namespaces: Sequence[str], ids: Set[Tuple[int, int]]) -> Set[int]:
    """Processes inside a namespace of ``ids`` (netns_ids: found by the namespace
    itself, so also once its name is deleted) or on their way into one of
    ``namespaces``. `ip netns pids` alone misses a process started just before it
    runs that has not entered yet: it enters a moment later, even after the name is
    deleted, and lives on in the unnamed namespace."""
    names, found = set(namespaces), set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
            if (st.st_dev, st.st_ino) in ids:
                found.add(int(entry))
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue  # ended meanwhile, or not ours to read
        if _entering(argv, names):
            found.add(int(entry))
    return found
