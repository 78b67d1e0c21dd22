"""The elastic driver: one per elastic netreduce-run, in the launcher's process.

It keeps the hosts (discovery.py), forms each membership epoch (membership.py: who
the ranks are), starts a worker process for every slot of an epoch that has none,
and answers the workers on its port (server.py). Its main loop reaps workers and
ends epochs; a second thread runs discovery every second. The life of a job:

1. wait (``--elastic-timeout``) until the hosts offer ``-np`` slots; form epoch 1 from
   them, at most ``--max-np`` ranks, and start its workers. Each asks the driver for
   its place at init() and registers at the aggregator with the epoch's number.
2. a worker exits non-zero: the others' collectives fail (the aggregator sees its
   connections close) and they reset: roll back to their last commit, leave the
   job and ask for their place in the next epoch (``join``).
   Discovery finds hosts added or removed: the driver counts a host update, which
   every worker learns from its ``updates`` poll and which makes every rank raise
   HostsUpdatedInterrupt at the same ``commit()`` (netreduce/elastic.py): they reset too.
3. once each worker of the epoch has checked in or exited, membership.decide says
   what next: the job is done, failed, or its next epoch forms — from the hosts not
   blacklisted, waiting at most ``--elastic-timeout`` for ``--min-np`` slots — and
   workers are started for its new slots. Surviving workers keep their processes;
   workers of removed or blacklisted hosts are told so and exit.
"""
from __future__ import annotations

import dataclasses
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from netreduce.launcher.elastic.assignment import Slot, assign
from netreduce.launcher.elastic.discovery import DiscoveryError, HostManager, Update
from netreduce.launcher.elastic.membership import (FAILURE, READY, SUCCESS, Decision,
                                                   Membership, decide, describe_exit,
                                                   previous_hosts_check)
from netreduce.launcher.elastic.server import BadRequest, DriverServer
from netreduce.protocol import messages

POLL_S = 0.05            # how often the main loop reaps workers
DISCOVER_EVERY_S = 1.0   # Horovod's DISCOVER_HOSTS_FREQUENCY_SECS
GRACE_S = 3.0            # SIGTERM -> SIGKILL when the job stops
REMOVED_GRACE_S = 10.0   # a removed worker that has not exited by then is stopped
UPDATES_WAIT_S = 30.0    # the longest an ``updates`` poll is held


@dataclasses.dataclass
class Settings:
    np: int
    min_np: int
    max_np: Optional[int]
    discovery: Any                       # discovery.ScriptDiscovery or FixedHosts
    elastic_timeout: float = 600.0
    reset_limit: Optional[int] = None
    cooldown: Optional[Tuple[int, int]] = None
    verbose: bool = False
    ahead_s: float = 120.0  # NETREDUCE_ELASTIC_AHEAD


def _say(text: str) -> None:
    print(f"netreduce-run: {text}", file=sys.stderr, flush=True)


class Driver:
    """``start_worker(slot, epoch) -> handle`` starts one worker process for ``slot``
    (launcher/spawn.py's RankProcess: poll, wait, send_signal, kill);
    ``stop_workers(handles, first_signal)`` stops the job's last ones (launcher/job.py's
    stop); the driver's port listens on ``host``."""

    def __init__(self, settings: Settings, job: str, secret: str,
                 start_worker: Callable[[Slot, int], Any], host: str = "127.0.0.1",
                 stop_workers: Optional[Callable[..., None]] = None) -> None:
        self.settings = settings
        self.job = job
        self.start_worker = start_worker
        self.stop_workers = stop_workers
        self.cond = threading.Condition()
        self.hosts = HostManager(settings.discovery, settings.cooldown)
        self.current: Optional[Membership] = None
        self.forming_since: Optional[float] = None   # waiting for slots since
        self.forming_min = settings.np
        self.epoch = 0
        self.resets = 0
        self.update_count = 0
        self.update_log: List[Tuple[int, int]] = []
        self.workers: Dict[str, Any] = {}          # live process per worker name
        self.removed: Dict[str, float] = {}        # live, but no member: since
        # Workers started for hosts discovery added, before the epoch that takes them:
        # name -> since. The host update is announced (deferred) once they all wait
        # at the driver, so the job trains on while they start (Python, the framework).
        self.ahead: Dict[str, float] = {}
        self.arrived: set = set()
        self.deferred = 0
        self.outcome: Optional[Decision] = None
        self.history: List[Dict[str, Any]] = []    # one record per epoch (tests, benchmarks)
        self.signals: List[int] = []
        self._stop = threading.Event()
        self.server = DriverServer(host, job, secret, {
            messages.ElasticJoin: self.on_join, messages.ElasticUpdates: self.on_updates,
            messages.ElasticStatus: self.on_status})
        self.address = self.server.address

    # --- the workers' requests (server threads) -----------------------------------
    def on_join(self, worker: str, msg: messages.ElasticJoin) -> messages.ElasticJoinReply:
        after = msg.after
        with self.cond:
            while True:
                if self.outcome is not None:
                    return messages.ElasticJoinReply(stop=self.outcome.message or "the job is over")
                cur = self.current
                if worker in self.ahead and (cur is None or worker not in cur.slots):
                    if worker not in self.arrived:  # started ahead: it waits for its epoch
                        self.arrived.add(worker)
                        self.cond.notify_all()
                elif cur is not None and cur.epoch > after:
                    if worker not in cur.slots:
                        return messages.ElasticJoinReply(removed=self._why_removed(worker, cur))
                    if worker in cur.joined or not cur.breaking():
                        cur.joined.add(worker)
                        return messages.ElasticJoinReply(epoch=cur.epoch, updates=cur.updates,
                                                         **cur.slots[worker].reply())
                    # a new worker of an epoch that is ending already: straight on to the next
                    cur.record(worker, READY)
                    self.cond.notify_all()
                elif cur is not None and cur.epoch == after:
                    if worker not in cur.slots:
                        return messages.ElasticJoinReply(removed=self._why_removed(worker, cur))
                    if cur.states.get(worker) is None:
                        cur.record(worker, READY)
                        self.cond.notify_all()
                elif cur is not None:
                    raise BadRequest(f"worker {worker} asks for the epoch after {after}, but "
                                     f"the job is at epoch {cur.epoch}")
                self.cond.wait(1.0)

    def _why_removed(self, worker: str, cur: Membership) -> str:
        host = worker.rpartition(":")[0]
        if self.hosts.is_blacklisted(host):
            return f"host {host} is blacklisted (a worker on it failed)"
        if host not in self.hosts.host_slots:
            return f"host {host} is no longer discovered"
        return f"slot {worker} has no rank in {cur.describe()}"

    def on_status(self, worker: str, msg: messages.ElasticStatus) -> messages.ElasticStatusReply:
        """The current epoch, and whether it is ending (a worker checked in or failed)."""
        with self.cond:
            cur = self.current
            return messages.ElasticStatusReply(
                epoch=cur.epoch if cur is not None else 0,
                breaking=cur is None or self.forming_since is not None or cur.breaking())

    def on_updates(self, worker: str, msg: messages.ElasticUpdates) -> messages.ElasticUpdatesReply:
        deadline = time.monotonic() + max(0.0, min(msg.wait, UPDATES_WAIT_S))
        with self.cond:
            while self.update_count <= msg.seen and self.outcome is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            return messages.ElasticUpdatesReply(
                update=self.update_count,
                changes=[(n, f) for n, f in self.update_log if n > msg.seen][-64:])

    # --- the main loop ------------------------------------------------------------
    def run(self) -> int:
        """Run the job to its end; the exit code."""
        try:
            self.hosts.update()
        except DiscoveryError as exc:  # a misconfiguration: fail now, as Horovod does
            _say(f"error: {exc}")
            return 1
        self.server.start()
        discoverer = threading.Thread(target=self._discover_loop, daemon=True,
                                      name="nr-elastic-discovery")
        discoverer.start()
        old = {s: signal.signal(s, lambda signum, frame: self.signals.append(signum))
               for s in (signal.SIGINT, signal.SIGTERM)} \
            if threading.current_thread() is threading.main_thread() else {}
        self.forming_since = time.monotonic()
        try:
            while True:
                if self.signals:
                    self._finish(Decision("failed", "", 128 + self.signals[0]))
                self._reap()
                with self.cond:
                    if self.outcome is not None:
                        break
                    if self.forming_since is not None:
                        self._try_form()
                    elif self.current is not None and self.current.complete():
                        self._epoch_over()
                    self._stop_removed()
                    self._announce_when_ready()
                    if self.outcome is None and self.forming_since is None:
                        self.cond.wait(POLL_S)
                if self.forming_since is not None:
                    time.sleep(POLL_S)
        finally:
            self._stop.set()
            for s, handler in old.items():
                signal.signal(s, handler)
            self._stop_all()
            self.server.stop()
        outcome = self.outcome
        if outcome.kind == "failed" and outcome.message:
            _say(f"error: elastic job '{self.job}' failed: {outcome.message}")
        return outcome.code

    def _finish(self, decision: Decision) -> None:
        with self.cond:
            if self.outcome is None:
                self.outcome = decision
            self.cond.notify_all()

    def _reap(self) -> None:
        for name, worker in list(self.workers.items()):
            code = worker.poll()
            if code is None:
                continue
            del self.workers[name]
            with self.cond:
                self.removed.pop(name, None)
                if self.ahead.pop(name, None) is not None:  # died before its epoch
                    self.arrived.discard(name)
                    if code != 0:
                        host = name.rpartition(":")[0]
                        _say(f"worker {name}, started for the added host {host}, "
                             f"{describe_exit(code)} before it joined")
                        self._blacklist(host)
                    self.cond.notify_all()
                    continue
                cur = self.current
                if cur is None or name not in cur.slots or getattr(worker, "epoch", 0) > cur.epoch:
                    continue  # a removed worker leaving, as asked
                slot = cur.slots[name]
                if code == 0:
                    cur.record(name, SUCCESS, 0)
                else:
                    cur.record(name, FAILURE, code)
                    _say(f"worker {name} (rank {slot.rank} of {slot.size}, epoch {cur.epoch}) "
                         f"{describe_exit(code)}; host {slot.host} will be blacklisted")
                self.cond.notify_all()

    def _try_form(self) -> None:
        """Form the next epoch once the hosts offer enough slots (lock held)."""
        need, have = self.forming_min, self.hosts.available_slots()
        waited = time.monotonic() - self.forming_since
        if have < need:
            if waited >= self.settings.elastic_timeout:
                available = ", ".join(f"{h}:{n}" for h, n in self.hosts.available()) or "none"
                self._finish(Decision(
                    "failed", f"timed out after {waited:.0f} s (--elastic-timeout "
                    f"{self.settings.elastic_timeout:g}) waiting for {need} slots; the hosts "
                    f"not blacklisted offer {have} (available: {available}; --min-np "
                    f"{self.settings.min_np}, {self.hosts.discovery.describe()})", 1))
            return
        hosts = self.hosts.available()
        why = previous_hosts_check(self.current, hosts)
        if why:
            self._finish(Decision("failed", why, 1))
            return
        slots = assign(hosts, self.settings.max_np)
        previous = self.current
        self.epoch += 1
        self.current = Membership(self.epoch, {s.name: s for s in slots}, self.update_count)
        self.forming_since = None
        self.history.append({"epoch": self.epoch, "size": len(slots), "at": time.time(),
                             "hosts": self.current.hosts(), "waited": waited})
        change = f" (was {previous.size})" if previous is not None else ""
        _say(f"elastic: {self.current.describe()}{change}")
        self.cond.notify_all()
        for name in list(self.ahead):
            if name in self.current.slots:  # its epoch: a member now
                self.workers[name].epoch = self.epoch
            del self.ahead[name]            # else it is told it has no place, and leaves
        self.arrived.clear()
        self.deferred = 0                   # this epoch takes the hosts as they are
        for slot in slots:
            if slot.name in self.workers and slot.name in self.removed:
                self.workers.pop(slot.name).kill()  # a removed worker's slot, taken again
                self.removed.pop(slot.name)
            if slot.name not in self.workers:
                try:
                    handle = self.start_worker(slot, self.epoch)
                except Exception as exc:  # spawn.LaunchError: no such program, say
                    self.current.record(slot.name, FAILURE, int(getattr(exc, "code", 127)))
                    _say(f"cannot start worker {slot.name}: {exc}")
                    continue
                handle.epoch = self.epoch
                self.workers[slot.name] = handle
        now = time.monotonic()
        for name in self.workers:
            if name not in self.current.slots:
                self.removed.setdefault(name, now)

    def _epoch_over(self) -> None:
        """Every worker of the current epoch checked in or exited (lock held)."""
        cur = self.current
        decision = decide(cur, self._blacklist, self.hosts.is_blacklisted, self.resets,
                          self.settings.reset_limit)
        if decision.kind != "reset":
            self._finish(decision)
            return
        self.resets += 1
        self.forming_since = time.monotonic()
        self.forming_min = self.settings.min_np
        self._try_form()

    def _blacklist(self, host: str) -> None:
        span = self.hosts.blacklist(host)
        if span is not None:
            _say(f"elastic: host {host} blacklisted (a worker on it failed)"
                 + (f" for {span:.0f} s (--blacklist-cooldown-range)" if span else ""))

    def _stop_removed(self) -> None:
        now = time.monotonic()
        for name, since in list(self.removed.items()):
            if now - since > REMOVED_GRACE_S and name in self.workers:
                self.workers[name].send_signal(signal.SIGTERM)
                self.removed[name] = now  # then again, until it exits

    def _stop_all(self) -> None:
        workers = list(self.workers.values())
        if self.stop_workers is not None:
            self.stop_workers(workers, signal.SIGTERM)
            return
        for w in workers:
            w.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and any(w.poll() is None for w in workers):
            time.sleep(0.02)
        for w in workers:
            w.kill()

    # --- discovery ----------------------------------------------------------------
    def _discover_loop(self) -> None:
        warned = ""
        while not self._stop.wait(DISCOVER_EVERY_S):
            try:
                found = self.hosts.discovery.find()
            except DiscoveryError as exc:  # transient: keep the last answer
                if str(exc) != warned:
                    _say(f"warning: {exc}")
                    warned = str(exc)
                continue
            warned = ""
            with self.cond:
                res = self.hosts.update(found)
                if res != Update.none:
                    self._hosts_changed(res)
                    self.cond.notify_all()

    def _hosts_changed(self, res: Update) -> None:
        """A host update that changes the current epoch's ranks: announce it to the
        workers, or — when it adds slots — start their workers first and announce it
        once they are up (_announce_when_ready). Lock held."""
        cur = self.current
        if cur is None or self.forming_since is not None:
            return  # the epoch being formed takes the hosts as they are now
        if self.hosts.available_slots() >= self.settings.min_np:
            upcoming = assign(self.hosts.available(), self.settings.max_np)
        else:
            upcoming = []
        if [(s.name, s.rank) for s in upcoming] == sorted(
                ((s.name, s.rank) for s in cur.slots.values()), key=lambda x: x[1]):
            return
        self.deferred |= int(res)
        now = time.monotonic()
        started = []
        for slot in upcoming:
            if slot.name in self.workers:
                continue
            try:
                handle = self.start_worker(slot, self.epoch + 1)
            except Exception as exc:  # spawn.LaunchError
                _say(f"cannot start worker {slot.name}: {exc}")
                continue
            handle.epoch = 0  # no epoch yet
            self.workers[slot.name] = handle
            self.ahead[slot.name] = now
            started.append(slot.name)
        available = ", ".join(f"{h}:{n}" for h, n in self.hosts.available())
        if started:
            _say(f"elastic: hosts added ({available} available); starting {len(started)} "
                 "worker(s) on them, the job trains on until they are up")
        self._announce_when_ready()

    def _announce_when_ready(self) -> None:
        """Count the deferred host update once the workers started ahead wait at the
        driver (or have had AHEAD_WAIT_S): every worker resets at its next commit. Lock held."""
        if not self.deferred or self.forming_since is not None:
            return
        starting = [n for n in self.ahead if n not in self.arrived]
        if starting and time.monotonic() - min(self.ahead[n] for n in starting) < \
                self.settings.ahead_s:
            return
        res = Update(self.deferred)
        self.deferred = 0
        self.update_count += 1
        self.update_log.append((self.update_count, int(res)))
        self.cond.notify_all()  # the workers' updates polls
        what = {Update.added: "added", Update.removed: "removed"}.get(res, "added and removed")
        _say(f"elastic: hosts {what} ({', '.join(f'{h}:{n}' for h, n in self.hosts.available())}"
             f" available); the workers reset at their next commit")
