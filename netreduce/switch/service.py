"""netreduce-switch as a long-running service: what its signals do.

SIGTERM (and SIGINT) stop the daemon gracefully, within ``--stop-timeout`` seconds:
the control port closes, so no new job or rank is admitted (a launch now gets
"connection refused" from the aggregator's address instead of hanging); every
connected job is failed with an error that names this aggregator and the reason, so
each rank's pending and next operations raise it at once instead of timing out; the
data plane keeps summing while the ranks leave (an all-reduce already on the wire
completes); when the last rank has gone, or the timeout has passed, the data threads
stop and the process exits 0. A second SIGTERM during the drain exits at once.

SIGHUP reloads nothing (every setting is a flag, and a running job's slot pool cannot
change under it) and has no log file to reopen (logs go to stderr, i.e. the journal
under systemd): it logs one status line for the daemon and one per admitted job, at
WARNING so that the default --log-level shows them."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Dict, List, Tuple

from netreduce.protocol import messages
from netreduce.switch import commands, coordinator

log = logging.getLogger("netreduce.switch")


class Lifecycle:
    """Signal handlers only set flags; the daemon's main loop acts on them, outside
    the interrupted frame."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.stop_reason = ""
        self.status_requested = threading.Event()
        self.terminations = 0

    def on_stop(self, name: str) -> None:
        self.terminations += 1
        if not self.stop_reason:
            self.stop_reason = name
        self.stop.set()

    def on_status(self) -> None:
        self.status_requested.set()


FELL_BACK_REASONS = ("memory", "max_jobs", "unreachable", "other")
FELL_BACK_TO = ("switch", "host")


def fell_back_counts(srv: Any) -> Dict[Tuple[str, str], int]:
    """(reason, to) -> jobs that this daemon refused (or that could not reach it) and
    that went on elsewhere, as their rank 0 reported (netreduce/worker/job_status.py)."""
    return dict(getattr(srv, "_nr_fell_back", {}))


def _handle_fell_back(srv: Any, sess: Any, msg: messages.FellBack) -> messages.Empty:
    """A job's rank 0 says the job runs elsewhere after this daemon did not take it.
    Not authenticated (the job was never admitted here): a count for the operator,
    with bounded labels and no job name."""
    reason, to = msg.reason, msg.to
    reason = reason if reason in FELL_BACK_REASONS else "other"
    to = to if to in FELL_BACK_TO else "host"
    with srv.lock:
        table = getattr(srv, "_nr_fell_back", None)
        if table is None:
            table = srv._nr_fell_back = {}
        table[(reason, to)] = table.get((reason, to), 0) + 1
    log.info("a job refused here (%s) went on with %s", reason,
             "the host all-reduce among its ranks" if to == "host" else "another aggregator")
    return messages.Empty()


def install() -> None:
    """The daemon's own commands on its control port (not on a rank's in-process
    aggregator: netreduce/switch/in_process.py)."""
    commands.register_handler(messages.FellBack, _handle_fell_back, inline=True)


def transport_line(t: Dict[str, Any]) -> str:
    """What carried the data ports' packets: with --transport xdp, how many went
    through the AF_XDP sockets and how many through the kernel's (and why)."""
    if t["transport"] != "xdp":
        why = f" (xdp fell back: {t['fallback']})" if t.get("fallback") else ""
        return f"data ports: kernel UDP sockets{why}"
    total: Dict[str, int] = {}
    for port in t["port_stats"]:
        for k, v in port.items():
            total[k] = total.get(k, 0) + v
    kernel_tx = sum(v for k, v in total.items() if k.startswith("tx_kernel"))
    return (f"data ports: AF_XDP on {t.get('device')} (XDP {t.get('mode')}): received "
            f"{total.get('rx_xsk', 0)} by AF_XDP, {total.get('rx_kernel', 0)} by socket; sent "
            f"{total.get('tx_xsk', 0)} by AF_XDP, {kernel_tx} by socket "
            f"({total.get('tx_kernel_unresolved', 0)} unresolved neighbour, "
            f"{total.get('tx_kernel_stale', 0)} stale, {total.get('tx_kernel_elsewhere', 0)} "
            f"other device, {total.get('tx_kernel_oversize', 0)} oversize); "
            f"{total.get('xsk_rx_dropped', 0) + total.get('xsk_rx_ring_full', 0)} dropped by AF_XDP")


def status_lines(srv: Any, address: str) -> List[str]:
    """One line for the daemon, one per job: what an operator asks with SIGHUP."""
    snap = srv.counters()
    g = snap["global"]
    lines = [f"status {address}: {g['jobs_active']}/{g['jobs_max']} jobs, "
             f"{g['jobs_admitted']} admitted, {g['jobs_refused']} refused; "
             f"packets in {g['packets_in']} out {g['packets_out']}, "
             f"{g['bytes_reduced']} B reduced, {g['duplicates']} duplicates, "
             f"{g['retransmitted_results']} results resent, {g['drops']} dropped; "
             f"slot memory {g['slot_memory_bytes']}/{g['slot_memory_limit_bytes']} B; "
             f"{sum(fell_back_counts(srv).values())} refused jobs went on elsewhere"]
    if snap.get("transport"):
        lines.append(transport_line(snap["transport"]))
    for name, c in sorted(snap["jobs"].items()):
        state = "finished, " if c.get("finished") else ""
        lines.append(f"job '{name}' (index {c['index']}): {state}"
                     f"{len(c['ranks'])}/{c['size']} ranks, "
                     f"{c.get('slots', '?')} slots x {c.get('payload_bytes', '?')} B, "
                     f"packets in {c['packets_in']} out {c['packets_out']}, "
                     f"{c['bytes_reduced']} B reduced, {c['duplicates']} duplicates, "
                     f"{c['drops']} dropped")
    return lines


def log_status(srv: Any, address: str, level: int = logging.WARNING) -> None:
    for line in status_lines(srv, address):
        log.log(level, "%s", line)


def _fail_jobs(srv: Any, message: str) -> int:
    """Fail every job's negotiation state: each rank's watch and long-poll wake with
    ``message``. Returns how many jobs were told."""
    states = list(coordinator._jobs(srv).values())
    for state in states:
        with state.cond:
            state.fail(message, -1, None)
    return len(states)


def _connected(srv: Any) -> Tuple[int, int]:
    with srv.lock:
        jobs = list(srv.jobs.values())
    return len(jobs), sum(len(j.ranks) for j in jobs)


def drain(srv: Any, lifecycle: Lifecycle, address: str, timeout: float) -> Dict[str, Any]:
    """Close admission, tell the jobs, wait up to ``timeout`` s for their ranks to
    leave. The caller stops the data plane afterwards. Returns what happened."""
    started = time.monotonic()
    srv.shutdown()       # serve_forever returns: no connection is accepted any more
    srv.server_close()   # the listening socket closes: new jobs are refused at once
    jobs, ranks = _connected(srv)
    told = _fail_jobs(srv, f"the aggregator netreduce-switch {address} is shutting down "
                           f"({lifecycle.stop_reason}); restart the job once it is back")
    first = lifecycle.terminations

    def wait_until(deadline: float) -> None:
        while time.monotonic() < deadline and lifecycle.terminations == first:
            if _connected(srv)[1] == 0:
                return
            time.sleep(0.05)

    # WARNING only when it matters, i.e. ranks are cut off: an embedded daemon, stopped
    # by a rank whose own connection is just closing, must stay quiet by default.
    wait_until(started + min(0.5, timeout))
    log.log(logging.WARNING if _connected(srv)[1] else logging.INFO,
            "%s: stopping: admission closed; %d jobs (%d ranks) connected, %d told; "
            "waiting up to %.1f s for them to leave", lifecycle.stop_reason, jobs, ranks,
            told, timeout)
    wait_until(started + timeout)
    left_jobs, left_ranks = _connected(srv)
    if left_ranks:
        log.warning("stopping with %d ranks of %d jobs still connected (their connections "
                    "close with the process)", left_ranks, left_jobs)
    return {"jobs": jobs, "ranks": ranks, "still_connected": left_ranks,
            "seconds": time.monotonic() - started}
