"""A static netreduce-run job: every rank started (spawn.py), then watched until all
exit 0, one fails, or netreduce-run is signalled.

When a rank exits non-zero the others get SIGTERM, then SIGKILL after spawn.GRACE_S,
and the job ends with that rank's code; SIGINT/SIGTERM sent to netreduce-run are
forwarded the same way. A remote rank's SIGKILL also stops it at its host's keeper,
and a host's ssh client whose keeper has not reported its ranks shortly after (an
unreachable host) is killed here."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from netreduce.launcher import spawn
from netreduce.launcher.hosts import Slot


def exit_code(returncode: int) -> int:
    return returncode if returncode > 0 else 128 - returncode


def stop(ranks: Sequence[spawn.Rank], first: int = signal.SIGTERM,
         grace_s: float = spawn.GRACE_S, kill_wait_s: float = 2.0) -> None:
    """``first`` to every rank, SIGKILL to whatever is left after ``grace_s`` (and to
    the process groups of ranks already exited: their strays); returns when every
    process on this side has exited."""
    for r in ranks:
        r.send_signal(first)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(r.poll() is None for r in ranks):
        time.sleep(0.02)
    # Every remote rank told first, then one shared wait: an unreachable host costs
    # kill_wait_s once, not once per rank.
    for r in ranks:
        if r.remote and r.poll() is None:
            r.send_signal(signal.SIGKILL)
        r.disconnect()
    deadline = time.monotonic() + kill_wait_s
    for r in ranks:
        if r.remote:
            try:
                r.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        r.kill(timeout_s=0.0)


class Job:
    """Start ``command`` on every slot; ``env_of(slot)`` gives a rank's environment,
    ``local[host]`` says whether its host is this machine, and ``connected`` holds the
    remote ranks already connected (spawn.connect_host()), by rank."""

    def __init__(self, command: Sequence[str], slots: Sequence[Slot],
                 env_of: Callable[[Slot], Mapping[str, str]], local: Mapping[str, bool],
                 output: spawn.Output, ssh: spawn.SshOptions, verbose: bool = False,
                 connected: Optional[Mapping[int, spawn.RemoteRank]] = None) -> None:
        self.ranks: List[spawn.Rank] = []
        self.output = output
        connected = dict(connected or {})
        try:
            for slot in slots:
                self.ranks.append(spawn.start(command, slot.rank, slot.host, env_of(slot),
                                              local=local[slot.host], output=output, ssh=ssh,
                                              verbose=verbose,
                                              connected=connected.pop(slot.rank, None)))
        except spawn.LaunchError:
            stop(self.ranks + list(connected.values()), signal.SIGKILL, grace_s=0.0)
            raise

    def supervise(self, received: List[int]) -> int:
        """Watch until done; ``received`` fills with signals netreduce-run got.
        Returns netreduce-run's exit code."""
        while True:
            if received:
                stop(self.ranks, received[0])
                return 128 + received[0]
            codes: Dict[int, Optional[int]] = {r.rank: r.poll() for r in self.ranks}
            failed = [r for r in self.ranks if codes[r.rank] not in (None, 0)]
            if failed:
                r = failed[0]
                rc = codes[r.rank]
                how = ""
                if r.remote and rc == 255:
                    how = " (255: ssh itself may have failed; its message is above)"
                print(f"netreduce-run: rank {r.rank} on {r.host} exited with code {rc}{how}; "
                      f"stopping the other {sum(c is None for c in codes.values())} rank(s)",
                      file=sys.stderr, flush=True)
                stop(self.ranks, signal.SIGTERM)
                return exit_code(rc)
            if all(c == 0 for c in codes.values()):
                stop(self.ranks, signal.SIGTERM)  # reap strays the ranks left in their groups
                return 0
            time.sleep(0.05)

    def finish(self) -> None:
        if any(r.poll() is None for r in self.ranks):
            stop(self.ranks, signal.SIGKILL, grace_s=0.0)
        self.output.close()
