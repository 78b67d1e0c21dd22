"""Helpers shared by the benchmarks: sizes, nccl-tests arithmetic, CPU and wire
counters, machine description, JSON records."""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, Iterable, Iterator, List, Optional


def _load_proc_stat():
    """netreduce/testbed/proc_stat.py of *this* checkout, loaded from its file: the
    netreduce a benchmark measures may be another checkout's (PYTHONPATH=DIR, --code,
    --before), older than that module; the module needs nothing but the standard
    library."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "netreduce", "testbed", "proc_stat.py")
    name = "_benchmarks_proc_stat"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before it runs: its dataclass looks itself up there
        spec.loader.exec_module(module)
    return sys.modules[name]


proc_stat = _load_proc_stat()   # /proc/PID/stat, read as netreduce's tests read it

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
          "mb": 1 << 20, "g": 1 << 30, "gib": 1 << 30, "gb": 1 << 30}


def parse_size(text: str) -> int:
    """'64M', '256KiB', '4096' -> bytes (binary units, like nccl-tests' -b/-e)."""
    m = re.fullmatch(r"\s*([0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot parse size {text!r}; write it like 4K, 64M, 256MiB")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def size_range(lo: int, hi: int, factor: int = 4) -> List[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def fmt_size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def iterations(size: int, target_bytes: int, lo: int, hi: int) -> int:
    """Timed iterations for one size: enough to move ~target_bytes, within [lo, hi].
    Derived from the size alone so that every rank agrees without talking."""
    return max(lo, min(hi, target_bytes // max(size, 1)))


def spread(vals: Iterable[Optional[float]], digits: int = 4) -> Dict[str, float]:
    """Median, min, max and count of the values that are there (None skipped), rounded;
    {} when there are none: how the benchmarks' records summarise repeated runs."""
    vals = [v for v in vals if v is not None]
    if not vals:
        return {}
    return {"median": round(statistics.median(vals), digits), "min": round(min(vals), digits),
            "max": round(max(vals), digits), "n": len(vals)}


def algbw(size: int, seconds: float) -> float:
    """nccl-tests algbw in GB/s (10^9): message bytes over time."""
    return size / seconds / 1e9 if seconds > 0 else 0.0


def busbw(size: int, seconds: float, n: int) -> float:
    """nccl-tests busbw for all-reduce: algbw x 2(n-1)/n, the per-link rate a ring
    needs; comparable across world sizes (and with the link rate)."""
    return algbw(size, seconds) * (2 * (n - 1) / n if n > 1 else 1.0)


# --- CPU ------------------------------------------------------------------------
def self_cpu_seconds() -> float:
    """user+system CPU of this process, all threads (the engine's included)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def stop(procs: Iterable[subprocess.Popen], grace_s: float = 10.0, terminate: bool = True) -> None:
    """Processes a benchmark started, gone: SIGTERM to those still running (unless
    ``terminate`` is False: they were told to exit some other way), then each waited
    for up to ``grace_s`` before SIGKILL, and reaped."""
    procs = list(procs)
    if terminate:
        for p in procs:
            if p.poll() is None:
                p.terminate()
    for p in procs:
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def pid_cpu_seconds(pid: int) -> float:
    return proc_stat.cpu_seconds(pid)


def pid_cpu_and_faults(pid: int) -> tuple:
    """(utime+stime seconds, minor page faults) of process ``pid``, every thread's
    (the kernel sums its threads' into /proc/PID/stat): a page freshly mapped and
    touched is one minor fault, which is how memory the allocator gave back to the
    kernel costs the next step."""
    stat = proc_stat.read(pid)
    return stat.cpu_seconds, stat.minflt


def machine_cpu() -> tuple:
    """(busy, total) jiffies of the whole machine, from /proc/stat; busy includes
    softirq time, where much of the emulated network's work happens."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])
    return total - idle, total


def machine_busy_fraction(before: tuple, after: tuple) -> float:
    busy = after[0] - before[0]
    total = after[1] - before[1]
    return busy / total if total > 0 else 0.0


class MachineCPUSampler:
    """The whole machine's CPU (``machine_cpu``) sampled every ``interval_s`` on a
    thread of its own, stamped with wall-clock microseconds (``time.time_ns() / 1000``,
    the clock of overlap_site's step stamps), so that a window of another process's
    steps can be read afterwards: ``window(t0_us, t1_us)``."""

    def __init__(self, interval_s: float = 0.02) -> None:
        import threading
        self.interval_s = interval_s
        self.samples: List[tuple] = []   # (time_us, busy, total, {group: CPU s}, {group: minflt})
        self.groups: Dict[str, List[int]] = {}
        self._last: Dict[int, tuple] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, group: str, pid: int) -> None:
        """Also sample process ``pid``'s CPU (all its threads), summed into ``group``."""
        self.groups.setdefault(group, []).append(pid)

    def _pid(self, pid: int) -> tuple:
        try:
            self._last[pid] = pid_cpu_and_faults(pid)
        except (OSError, IndexError, ValueError):
            pass  # gone: its last reading stands
        return self._last.get(pid, (0.0, 0))

    def _run(self) -> None:
        while True:
            cpu: Dict[str, float] = {}
            faults: Dict[str, int] = {}
            for g, pids in list(self.groups.items()):
                readings = [self._pid(p) for p in pids]
                cpu[g] = sum(r[0] for r in readings)
                faults[g] = sum(r[1] for r in readings)
            self.samples.append((time.time_ns() / 1000.0,) + machine_cpu() + (cpu, faults))
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> "MachineCPUSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def window(self, t0_us: float, t1_us: float) -> Optional[Dict[str, float]]:
        """Over the samples nearest inside [t0_us, t1_us]: the machine's busy fraction
        (of all its cores) and its busy CPU-seconds, and each watched group's CPU-seconds
        (``GROUP_cpu_s``) and minor page faults (``GROUP_minflt``); None with fewer
        than 2 samples."""
        inside = [x for x in self.samples if t0_us <= x[0] <= t1_us]
        if len(inside) < 2:
            return None
        (a, busy0, total0, g0, f0), (b, busy1, total1, g1, f1) = inside[0], inside[-1]
        tick = os.sysconf("SC_CLK_TCK")
        out = {"busy_fraction": round(machine_busy_fraction((busy0, total0), (busy1, total1)), 4),
               "busy_cpu_s": round((busy1 - busy0) / tick, 4),
               "seconds": round((b - a) / 1e6, 4)}
        for group in g1:
            out[group + "_cpu_s"] = round(g1[group] - g0.get(group, 0.0), 4)
            out[group + "_minflt"] = f1[group] - f0.get(group, 0)
        return out


# --- wire -----------------------------------------------------------------------
def wire_counters(ifname: Optional[str]) -> Optional[Dict[str, int]]:
    """tx/rx bytes of `ifname` as this process's network namespace sees it (inside a
    testbed host, `eth0` is that host's link)."""
    if not ifname:
        return None
    base = f"/sys/class/net/{ifname}/statistics/"
    try:
        with open(base + "tx_bytes") as f:
            tx = int(f.read())
        with open(base + "rx_bytes") as f:
            rx = int(f.read())
    except OSError:
        return None
    return {"tx": tx, "rx": rx}


# --- description ----------------------------------------------------------------
def _version(module: str) -> Optional[str]:
    """``module``'s version, from its installed distribution's metadata where it has one:
    importing it only to read ``__version__`` cost a driver that never uses torch ~2.8
    CPU-s (the whole of benchmarks/train.py's own CPU besides its ranks'). The same
    string (torch's "2.13.0+cpu" included); a module already imported, or importable
    without metadata (a source tree on PYTHONPATH), is asked as before."""
    import importlib.metadata
    import importlib.util

    mod = sys.modules.get(module)
    if mod is None:
        try:
            return importlib.metadata.version(module)
        except Exception:  # no distribution (or broken metadata): ask the module itself
            pass
    try:
        if mod is None:
            if importlib.util.find_spec(module) is None:
                return None
            mod = __import__(module)
        return getattr(mod, "__version__", "?")
    except Exception:
        return None


def horovod_missing() -> Optional[str]:
    """Why Horovod's PyTorch peer cannot run here (None when it can)."""
    probe = subprocess.run([sys.executable, "-c", "import horovod.torch"], capture_output=True,
                           text=True)
    if probe.returncode != 0:
        return "horovod.torch not importable (run benchmarks/setup_peers.sh)"
    if shutil.which("horovodrun") is None:
        return "horovodrun not on PATH"
    return None


def log_tail(path: str, lines: int = 6, chars: int = 600) -> str:
    """The last `lines` non-empty lines of a rank's log, joined on one line and cut to
    the last `chars` characters: what a benchmark's error record quotes."""
    try:
        with open(path, errors="replace") as f:
            text = [ln for ln in f.read().splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:])[-chars:]


def run_cleanups(cleanup: List[Callable[[], object]]) -> None:
    """Undo a run's set-up, last step first; a failing step does not stop the rest."""
    for fn in reversed(cleanup):
        try:
            fn()
        except Exception:
            pass


def machine_description() -> Dict[str, object]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    try:
        with open("/proc/meminfo") as f:
            mem_gib = round(int(f.readline().split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    mpi = None
    try:
        out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=10).stdout
        mpi = out.splitlines()[0].strip() if out else None
    except Exception:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "torch": _version("torch"),
        "horovod": _version("horovod"),
        "mpi": mpi,
    }


def commit_of(tree: str) -> str:
    """The short commit checkout ``tree`` has out (its HEAD, not what its working tree
    changed), for a record; "" where git cannot say."""
    try:
        return subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def command_line() -> str:
    return shlex.join([os.path.relpath(sys.argv[0]) if os.path.exists(sys.argv[0]) else sys.argv[0],
                       *sys.argv[1:]])


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def write_record(path: str, summary: dict, runs: list) -> None:
    """One run's record as the issue-33 A/B benchmarks keep it: the command, the time,
    the summary and every run."""
    with open(path, "w") as f:
        json.dump({"command": sys.argv, "utc": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()),
                   "summary": summary, "runs": runs}, f, indent=1)


def write_json(path: str, meta: dict, records: Iterable[dict]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"meta": meta, "records": list(records)}, f, indent=1)
    os.replace(tmp, path)


# --- reporting (records of benchmarks/allreduce.py) ----------------------------
def print_tables(records: List[dict], impls: List[str], file=sys.stdout) -> None:
    for n in sorted({r["np"] for r in records}):
        rows = {(r["impl"], r["size"]): r for r in records if r["np"] == n}
        sizes = sorted({r["size"] for r in records if r["np"] == n})
        present = [i for i in impls if any((i, s) in rows for s in sizes)]
        print(f"\n# N = {n}   (time in ms; algbw, busbw in GB/s; ratio = netreduce time / other time)",
              file=file)
        head = f"{'size':>10} {'count':>11} {'type':>7}"
        for i in present:
            head += f" | {i[:9]:>9} {'algbw':>6} {'busbw':>6}"
        others = [i for i in present if i != "netreduce"] if "netreduce" in present else []
        for o in others:
            head += f" | {'nr/' + o[:5]:>8}"
        print(head, file=file)
        for s in sizes:
            line = f"{s:>10} {s // 4:>11} {'float':>7}"
            for i in present:
                r = rows.get((i, s))
                if r:
                    flag = "" if r["correct"] else "!"
                    line += f" | {r['time_s'] * 1e3:>8.2f}{flag or ' '} {r['algbw_GBps']:>6.3f} {r['busbw_GBps']:>6.3f}"
                else:
                    line += f" | {'-':>9} {'-':>6} {'-':>6}"
            nr = rows.get(("netreduce", s))
            for o in others:
                ratio = nr.get(f"ratio_vs_{o}") if nr else None
                line += f" | {ratio:>8.3f}" if ratio else f" | {'-':>8}"
            print(line, file=file)
        if any("wire_tx_per_host" in r for r in rows.values()):
            print(f"\n# N = {n}: wire bytes per host per all-reduce (each way, / S), CPU "
                  f"(worker mean/max, aggregator, whole machine), netreduce retransmitted packets",
                  file=file)
            print(f"{'size':>10} {'impl':>10} {'tx/S':>6} {'rx/S':>6} {'txmax/S':>8} "
                  f"{'cpu':>5} {'cpumax':>6} {'switch':>6} {'machine':>7} {'retx':>6}", file=file)
            for s in sizes:
                for i in present:
                    r = rows.get((i, s))
                    if not r or "wire_tx_per_host" not in r:
                        continue
                    sw = f"{r['cpu_switch']:>6.0%}" if "cpu_switch" in r else f"{'-':>6}"
                    pk = r.get("packets_per_rank")
                    retx = f"{r['retransmits_per_rank'] / pk:>6.1%}" if pk else f"{'-':>6}"
                    print(f"{s:>10} {i:>10} {r['wire_tx_per_host'] / s:>6.3f} "
                          f"{r['wire_rx_per_host'] / s:>6.3f} {r['wire_tx_max'] / s:>8.3f} "
                          f"{r['cpu_worker_mean']:>5.0%} {r['cpu_worker_max']:>6.0%} {sw} "
                          f"{r.get('machine_busy', 0):>7.0%} {retx}", file=file)


def markdown(meta: dict, records: List[dict], impls: List[str]) -> str:
    """The run as a BENCHMARKS.md section: how it was taken, then nccl-tests tables."""
    m = meta["machine"]
    out = [f"### all-reduce, {meta['mode']}" + (f", {meta['rate']} per host" if meta.get("rate") else "")
           + f" ({meta['date']})", "",
           f"- command: `{meta['command']}`",
           f"- machine: {m['cpu']} x{m['cores']} cores, {m['memory_gib']} GiB, kernel {m['kernel']}; "
           f"Python {m['python']}, numpy {m['numpy']}, torch {m['torch']}, horovod {m['horovod']}, {m['mpi']}",
           f"- load average at start/end: {'/'.join(f'{x:.1f}' for x in meta['loadavg_at_start'])} / "
           f"{'/'.join(f'{x:.1f}' for x in meta['loadavg_at_end'])} (2 cores shared with other work)",
           "- float32 sum; time = slowest rank's mean over the timed iterations after one verified "
           "warm-up; algbw = S/t, busbw = algbw x 2(N-1)/N in GB/s (10^9 B/s)"]
    if meta.get("switch_args") or any(meta.get("netreduce_connect", {}).values()):
        out.append(f"- netreduce options: switch `{meta.get('switch_args') or '(testbed default)'}`, "
                   f"connect {meta.get('netreduce_connect')}")
    if meta.get("queue_drops"):
        out.append("- packets dropped at the shapers' queues (whole sweep): "
                   + ", ".join(f"{k}: {v}" for k, v in meta["queue_drops"].items()))
    if meta.get("errors"):
        out.append(f"- errors: {'; '.join(meta['errors'])}")
    for n in sorted({r["np"] for r in records}):
        rows = {(r["impl"], r["size"]): r for r in records if r["np"] == n}
        sizes = sorted({r["size"] for r in records if r["np"] == n})
        present = [i for i in impls if any((i, sz) in rows for sz in sizes)]
        others = [i for i in present if i != "netreduce"] if "netreduce" in present else []
        out += ["", f"N = {n}: time (ms) and busbw (GB/s); ratio = netreduce time / other time", ""]
        head = "| size |" + "".join(f" {i} ms | {i} busbw |" for i in present) + "".join(
            f" nr/{o} |" for o in others)
        out += [head, "|" + "---|" * (1 + 2 * len(present) + len(others))]
        for sz in sizes:
            line = f"| {fmt_size(sz)} |"
            for i in present:
                r = rows.get((i, sz))
                line += (f" {r['time_s'] * 1e3:.2f}{'' if r['correct'] else ' (WRONG)'} | {r['busbw_GBps']:.3f} |"
                         if r else " - | - |")
            nr = rows.get(("netreduce", sz))
            for o in others:
                ratio = nr.get(f"ratio_vs_{o}") if nr else None
                line += f" {ratio:.3f} |" if ratio else " - |"
            out.append(line)
        if rows:
            wire = any("wire_tx_per_host" in r for r in rows.values())
            out += ["", f"N = {n}: " + ("wire bytes per host per all-reduce, each way, over S (veth counters); "
                                         if wire else "(loopback: no wire counters) ")
                    + "CPU as a fraction of one core (worker mean / max, aggregator); whole-machine busy "
                      "fraction; netreduce packets retransmitted", "",
                    "| size | impl | tx/S | rx/S | worker CPU | max | aggregator CPU | machine busy | retx |",
                    "|---|---|---|---|---|---|---|---|---|"]
            for sz in sizes:
                for i in present:
                    r = rows.get((i, sz))
                    if not r:
                        continue
                    pk = r.get("packets_per_rank")
                    tx = f"{r['wire_tx_per_host'] / sz:.3f}" if "wire_tx_per_host" in r else "-"
                    rx = f"{r['wire_rx_per_host'] / sz:.3f}" if "wire_rx_per_host" in r else "-"
                    out.append(
                        f"| {fmt_size(sz)} | {i} | {tx} | {rx} | "
                        f"{r['cpu_worker_mean']:.0%} | {r['cpu_worker_max']:.0%} | "
                        + (f"{r['cpu_switch']:.0%}" if "cpu_switch" in r else "-")
                        + f" | {r.get('machine_busy', 0):.0%} | "
                        + (f"{r['retransmits_per_rank'] / pk:.1%}" if pk else "-") + " |")
    return "\n".join(out) + "\n"


# A command prefix that runs a process without CAP_NET_ADMIN (util-linux setpriv), as a
# training job of an ordinary user runs: its SO_RCVBUFFORCE is refused and SO_RCVBUF
# stops at net.core.rmem_max.
NO_NET_ADMIN = ["setpriv", "--bounding-set=-net_admin", "--inh-caps=-net_admin"]
RMEM_MAX = "/proc/sys/net/core/rmem_max"


@contextlib.contextmanager
def rmem_max_set(value: int) -> Iterator[None]:
    """net.core.rmem_max = `value` (0: as it is) for the block, put back after (root)."""
    if not value:
        yield
        return
    with open(RMEM_MAX) as f:
        before = f.read().strip()
    with open(RMEM_MAX, "w") as f:
        f.write(str(value))
    try:
        yield
    finally:
        with open(RMEM_MAX, "w") as f:
            f.write(before)
