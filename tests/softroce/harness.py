"""Host side of the Soft-RoCE tests: a bridge and tap named for this run, an
aggregator per address, nftables loss, a capture, and one QEMU guest booted with
scripts/softroce/run_guest.sh (docs/verbs.md)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

import pytest

from tests.peers import in_ci

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "softroce"
HINT = "run `bash scripts/env_softroce.sh` as root (scripts/install.sh test does)"


def require_softroce() -> None:
    """Skip (fail under CI) unless this host can boot a Soft-RoCE guest."""
    reason = None
    if os.geteuid() != 0:
        reason = "needs root (tap/bridge, nftables, qemu)"
    elif not os.path.exists("/dev/net/tun"):
        reason = "no /dev/net/tun: cannot create the guest's tap"
    elif shutil.which("qemu-system-x86_64") is None:
        reason = "qemu-system-x86_64 is not installed"
    elif shutil.which("dumpcap") is None or shutil.which("nft") is None:
        reason = "needs dumpcap (tshark) and nft"
    else:
        from netreduce import _native
        if not getattr(_native, "HAVE_VERBS", False):
            reason = "this build has no verbs transport (libibverbs-dev missing at build time)"
    if reason is None:
        return
    if in_ci():
        pytest.fail(f"{reason}: CI must run the Soft-RoCE tests; {HINT}", pytrace=False)
    pytest.skip(f"{reason}; {HINT}")


class SoftRoceBed:
    """bridge nrb<tag> with 10.213.<n>.1 and .3 (two aggregator addresses), tap nrt<tag>
    for the guest at .2; nftables table netreduce_sr<tag>."""

    def __init__(self, workdir: Path) -> None:
        tag = os.getpid() % 100000
        self.tag = tag
        net = 100 + tag % 150
        self.bridge, self.tap = f"nrb{tag}", f"nrt{tag}"
        self.host_ip, self.lossy_ip, self.guest_ip = (f"10.213.{net}.1", f"10.213.{net}.3",
                                                      f"10.213.{net}.2")
        self.table = f"netreduce_sr{tag}"
        self.workdir = workdir
        self.procs: List[subprocess.Popen] = []
        self.capture: Optional[subprocess.Popen] = None

    def __enter__(self) -> "SoftRoceBed":
        subprocess.run(["bash", str(SCRIPTS / "net_up.sh"), self.bridge, self.host_ip + "/24",
                        self.tap], check=True)
        subprocess.run(["ip", "addr", "add", self.lossy_ip + "/24", "dev", self.bridge], check=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_capture()
        subprocess.run(["nft", "delete", "table", "inet", self.table], capture_output=True)
        subprocess.run(["bash", str(SCRIPTS / "net_down.sh"), self.bridge, self.tap])

    def drop(self, percent: int, ip: str) -> None:
        """Drop `percent` % of the guest's RoCE packets to `ip`, and of `ip`'s to it."""
        g = self.guest_ip
        rules = (f"table inet {self.table} {{\n"
                 f" chain input {{ type filter hook input priority 0; ip saddr {g} ip daddr {ip} "
                 f"udp dport 4791 numgen random mod 100 < {percent} counter drop; }}\n"
                 f" chain output {{ type filter hook output priority 0; ip saddr {ip} ip daddr {g} "
                 f"udp dport 4791 numgen random mod 100 < {percent} counter drop; }}\n}}\n")
        subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)

    def dropped(self) -> int:
        out = subprocess.run(["nft", "list", "table", "inet", self.table], capture_output=True,
                             text=True).stdout
        return sum(int(w.split()[1]) for w in out.split("counter")[1:] if "packets" in w.split()[0])

    def tap_dropped(self) -> int:
        """Packets the host dropped on their way into the guest: the tap's queue
        overflows when QEMU (TCG, on a loaded host) reads it too slowly. They crossed
        the bridge, so the capture has them, but the guest never saw them."""
        return int(Path(f"/sys/class/net/{self.tap}/statistics/tx_dropped").read_text())

    def start_capture(self, path: Path) -> None:
        self.capture = subprocess.Popen(
            ["dumpcap", "-q", "-i", self.bridge, "-P", "-s", "0", "-f", "udp port 4791", "-w", str(path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # dumpcap opens the interface

    def stop_capture(self) -> None:
        if self.capture is not None and self.capture.poll() is None:
            self.capture.send_signal(signal.SIGINT)
            try:
                self.capture.wait(10)
            except subprocess.TimeoutExpired:
                self.capture.kill()
        self.capture = None

    def boot(self, rundir: Path, script: str, timeout: int = 420) -> int:
        """Run `script` (sh) as the guest's run.sh; returns its exit status."""
        rundir.mkdir(parents=True, exist_ok=True)
        (rundir / "run.sh").write_text(script)
        env = dict(os.environ)
        extra = guest_shares()
        if extra:
            env["NR_EXTRA_SHARES"] = ":".join(extra)
        proc = subprocess.run(["bash", str(SCRIPTS / "run_guest.sh"), str(rundir), self.tap,
                               self.guest_ip + "/24", str(timeout)], env=env)
        return proc.returncode


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def guest_shares() -> List[str]:
    """Host directories the guest needs beyond /usr, /etc and the repository (which
    run_guest.sh always shares), each shared read-only at its own path: this
    interpreter's prefix (a venv: its site-packages) and, when they differ, the base
    installation it points to (sys.base_prefix: pyenv, uv or conda Python, whose
    binary and standard library live there) and the directory of the binary the
    interpreter's symlinks lead to. A directory inside another one shared is left
    out: a read-only share cannot hold a mount point made for it."""
    always = ["/usr", "/etc", os.path.realpath(REPO)]
    wanted = [os.path.realpath(d) for d in
              (sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)))]
    out: List[str] = []
    for d in sorted(set(wanted), key=len):  # outer directories first
        if not any(_under(d, r) for r in always + out):
            out.append(d)
    return out


def guest_env() -> str:
    """The guest's environment for run.sh's `export`: the checkout under test first on
    the path (an editable install may point at another checkout, which the guest
    does not see), no bytecode written into the read-only shares."""
    return f"HOME=/root PYTHONDONTWRITEBYTECODE=1 PYTHONPATH={os.path.realpath(REPO)}"


def guest_python() -> str:
    """This interpreter, as the guest's chroot of the host's filesystem sees it: the
    path it was started by (a venv's bin/python, so the venv's pyvenv.cfg and
    site-packages apply), its directory resolved, the last link kept."""
    exe = sys.executable
    return os.path.join(os.path.realpath(os.path.dirname(exe)), os.path.basename(exe))
