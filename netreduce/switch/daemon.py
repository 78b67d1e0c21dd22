"""netreduce-switch: the software aggregator daemon.

It stands where the switch would: the native aggregator (netreduce._native)
receives the workers' RoCEv2 packets on UDP ports PORT..PORT+THREADS-1 and sums
them slot by slot on its own threads; this Python process only runs the control
port (TCP PORT): job admission, rank check-in, negotiation and counters."""
from __future__ import annotations

import argparse
import logging
import signal
import socket
import ssl
import sys
import threading
from typing import Any, Optional, Sequence, Tuple

from netreduce import config
from netreduce._version import __version__
from netreduce.errors import NetReduceError
from netreduce.protocol.address import family_of, format_address
from netreduce.protocol import tls
from netreduce.protocol.auth import Guard, read_operator_secret
from netreduce.protocol.socket_buffers import receive_buffer_note
from netreduce.switch import coordinator  # noqa: F401  registers the negotiation commands
from netreduce.switch import job_keys, service, uplink
from netreduce.switch.child import METRICS_PREFIX, READY_PREFIX
from netreduce.switch.limits import Limits
from netreduce.switch.server import ControlServer
from netreduce.switch.settings import DEFAULTS, aggregator_args


def build_parser() -> argparse.ArgumentParser:
    # One add_argument a flag, on purpose: the runs of same-shaped calls below are
    # distinct flags, and a table would hold the same names, defaults and help in
    # another syntax. The aggregator's defaults are settings.py's (DEFAULTS).
    p = argparse.ArgumentParser(
        prog="netreduce-switch",
        description="Software in-network aggregator: sums the gradients of N workers slot by "
                    "slot and returns the sum to all of them (RoCEv2-framed UDP).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--host", default=DEFAULTS["host"],
                   help="address to listen on, for the TCP control port and the UDP data ports: "
                        "IPv4, IPv6 ('::' serves IPv4 and IPv6 ranks alike) or a host name")
    p.add_argument("--port", type=int, default=DEFAULTS["port"],
                   help="TCP control port; UDP data ports are PORT..PORT+THREADS-1 "
                        "(4791 is RoCEv2's port); 0 picks a free one and prints it")
    p.add_argument("--slots", type=int, default=None,
                   help="slots per job (K) at the largest payload (--payload-bytes): how many "
                        "packets each worker may have in flight; a job whose payload is smaller "
                        "(its path's MTU) gets more, in proportion, so that every job holds the "
                        "same bytes in flight. Unset, the slots hold 2 MiB at --payload-bytes "
                        "(32 at the default 65464; 1462 slots of 1432 B at MTU 1500)")
    p.add_argument("--payload-bytes", type=int, default=None,
                   help="the largest payload per slot (P), a multiple of 8. Unset, each job's "
                        "P follows its path: the largest whose RoCEv2 packet fits the "
                        "smallest MTU any of its ranks (or this daemon) sees, e.g. 8936 at "
                        "MTU 9000, 1432 at 1500, 65464 on loopback; set, it caps that. "
                        "<= 4096 gives standard RoCE-sized packets with a verified ICRC, "
                        "larger uses the flagged software jumbo extension; 16-bit floats "
                        "carry P/4 elements since they are summed in float32")
    p.add_argument("--max-jobs", type=int, default=DEFAULTS["max_jobs"],
                   help="jobs admitted at once; one more is refused with a clear error")
    p.add_argument("--memory-mb", type=int, default=DEFAULTS["memory_limit"] >> 20,
                   help="slot memory for all jobs together, MiB; each job takes "
                        "slots x payload x 2 (two shadow sets)")
    p.add_argument("--threads", type=int, default=DEFAULTS["threads"],
                   help="data threads; thread t owns UDP port PORT+t and the slots s with "
                        "s %% THREADS == t")
    p.add_argument("--data-nice", type=int, default=DEFAULTS["data_nice"],
                   help="the data threads' nice: every rank waits on them, and on a host "
                        "they share with busy ranks their fair share of the cores is below "
                        "what the input needs; they wake only when packets come. Below 0 "
                        "needs root or CAP_SYS_NICE (without it they keep the daemon's own, "
                        "and the ready line says so); 0 leaves them as they are")
    p.add_argument("--transport", choices=("udp", "xdp"), default=DEFAULTS["transport"],
                   help="what carries the data ports: 'udp', kernel UDP sockets; 'xdp', an "
                        "AF_XDP socket per data thread on the device's queues (thread t: queue "
                        "t), fed by an XDP program that steers only the data ports' UDP and "
                        "passes everything else to the kernel (needs root or CAP_BPF + "
                        "CAP_NET_ADMIN + CAP_NET_RAW; docs/xdp.md). Where it cannot attach, "
                        "the daemon logs why and uses kernel sockets (see --no-xdp-fallback)")
    p.add_argument("--xdp-device", default=DEFAULTS["xdp_device"],
                   help="with --transport xdp: the network device to attach to; default: the "
                        "one holding --host (a wildcard --host needs it named)")
    p.add_argument("--xdp-mode", choices=("auto", "native", "generic"),
                   default=DEFAULTS["xdp_mode"],
                   help="with --transport xdp: where the XDP program runs: 'native' in the "
                        "driver, 'generic' after the kernel built its packet buffer (any "
                        "device, slower); 'auto' tries native first")
    p.add_argument("--no-xdp-fallback", dest="xdp_fallback", action="store_false",
                   help="with --transport xdp: exit with the reason (status 2) instead of "
                        "falling back to kernel sockets when AF_XDP cannot be had")
    p.add_argument("--fanout", choices=("unicast", "multicast", "auto", "segment"),
                   default=DEFAULTS["fanout"],
                   help="how a finished slot reaches the workers: 'unicast' sends one "
                        "standard RoCE packet per rank; 'multicast' sends one packet to the "
                        "job's IPv4 multicast group and lets the network replicate it, as a "
                        "switch would (software extension; workers must share an L2 "
                        "segment or the same host); 'auto' sends the group's packet and a "
                        "unicast copy to each rank that has not said, in its last "
                        "contribution, that the group reached it within a second (ranks that "
                        "cannot join the group, or stop receiving it, lose no time); "
                        "'segment' is 'auto' for each job whose every rank is on this "
                        "host's own L2 segment (this host, or a directly connected subnet: "
                        "the group cannot flood beyond the job's segment) and 'unicast' for "
                        "any other job, decided per job as its last rank registers")
    p.add_argument("--multicast-base", dest="group_base", default=DEFAULTS["group_base"],
                   help="job J's results go to group BASE+J, UDP port PORT+THREADS")
    p.add_argument("--log-level", default="WARNING", help="Python logging level (stderr)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on http://METRICS_HOST:PORT/metrics "
                        "(docs/operations.md lists them); 0 picks a free port and prints it; "
                        "off when not given")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address the metrics endpoint listens on; it shows every job's "
                        "counters, so it stays on this host unless you choose otherwise "
                        "(docs/operations.md, Security)")
    p.add_argument("--require-secret", action="store_true",
                   help="refuse jobs whose ranks bring no job secret (NETREDUCE_JOB_SECRET; "
                        "netreduce-run always sets one), on loopback too; listening beyond "
                        "loopback, that is the default")
    p.add_argument("--allow-open-jobs", action="store_true",
                   help="listening beyond loopback, still admit jobs whose ranks bring no job "
                        "secret: anyone who can reach the control port and knows a job's name "
                        "may join or read it. Only on a network whose every host you trust")
    p.add_argument("--job-secrets", default=None, metavar="FILE",
                   help="pre-registered job names: lines 'JOB ed25519:KEY' (`netreduce job-key "
                        "JOB` prints one), 'JOB @SECRET_FILE' or 'JOB SECRET'; a listed name is "
                        "admitted only to ranks proving its key, so nobody can take it before "
                        "its ranks come. Re-read on SIGHUP")
    p.add_argument("--tls-cert", default=None, metavar="PEM",
                   help="serve the control port over TLS with this certificate (chain); ranks "
                        "then need NETREDUCE_TLS_CA, the CA that signed it")
    p.add_argument("--tls-key", default=None, metavar="PEM",
                   help="the private key of --tls-cert (default: in the --tls-cert file)")
    p.add_argument("--operator-secret-file", default=None, metavar="FILE",
                   help="the operator's secret (at least 16 bytes): a control connection "
                        "that proves it (HMAC challenge) reads every job's counters; others "
                        "read only their own job's and open jobs'")
    p.add_argument("--handshake-timeout", type=float, default=30.0,
                   help="seconds a control connection may stay silent before it belongs to "
                        "a job (or the operator); then it is closed")
    p.add_argument("--max-pending", type=int, default=1024,
                   help="control connections not yet bound to a job, at once; past that, "
                        "a new one closes the oldest")
    p.add_argument("--max-pending-jobs", type=int, default=Limits.pending_jobs_per_source,
                   help="jobs whose ranks have not all registered yet, from one source "
                        "address at once; they hold their pools beside --max-jobs (which "
                        "counts only jobs whose every rank has registered)")
    p.add_argument("--pending-job-timeout", type=float, default=Limits.pending_job_s,
                   help="seconds a job's ranks have to register after its first; then the "
                        "job is dropped, its registered ranks told why")
    p.add_argument("--finished-job-s", type=float, default=Limits.finished_job_s,
                   help="seconds a finished job's last counters stay readable (counters, "
                        "metrics: marked finished) after its last rank leaves; 0: dropped "
                        "with the job")
    p.add_argument("--stop-timeout", type=float, default=10.0,
                   help="on SIGTERM, seconds to wait for connected ranks to leave after "
                        "admission closes and their jobs are told; then exit 0 regardless")
    p.add_argument("--spine", action="append", default=None, metavar="HOST[:PORT]",
                   help="make this a rack aggregator of the spine aggregator at HOST: it takes "
                        "rack jobs from that spine only, sums its rack's ranks and sends one "
                        "partial sum per slot up (two levels: docs/design.md); repeatable")
    p.add_argument("--uplink-rto-ms", type=float, default=1.0,
                   help="rack aggregator: floor of the timeout after which a partial sum the "
                        "spine has not answered is resent (it follows the spine's round trip "
                        "and doubles per resend up to 1 s, or up to this floor where larger)")
    p.add_argument("--uplink-drop-rate", type=float, default=0.0,
                   help="testing: share of partial sums sent and spine results received that "
                        "a rack aggregator drops on purpose")
    p.add_argument("--uplink-drop-results", type=int, default=0,
                   help="testing: a rack aggregator drops the first this many spine results of "
                        "each rack job (results only: a lost answer at a known place)")
    return p


def _loopback(host: str) -> bool:
    """Whether only this host can reach ``host`` (a loopback address or a name that
    resolves only to loopback ones): then a job needs no secret by default."""
    import ipaddress
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addrs = {ipaddress.ip_address(str(ai[4][0]).split("%")[0]) for ai in infos}
    return bool(addrs) and all(a.is_loopback or (getattr(a, "ipv4_mapped", None) or a).is_loopback
                               for a in addrs)


def _payload_words(payload_bytes: Optional[int]) -> str:
    if payload_bytes is None:
        return "path-MTU payload per job"
    return f"payload <= {payload_bytes} B"


# Bytes a job keeps in flight per rank by default: DEFAULTS["slots"] (32) slots of the
# wire's largest payload. A window of 32 slots of 1432 B (45 KiB) leaves the link idle
# while results come back and gives GSO no runs to coalesce.
DEFAULT_INFLIGHT_SLOTS = DEFAULTS["slots"]


def default_slots(payload_bytes: Optional[int], max_payload: int) -> int:
    """--slots unset: as many as hold 32 of the wire's largest payloads at the
    --payload-bytes cap, so that lowering the cap (RoCE-sized 4096 B, or 1432 for
    one frame at MTU 1500) does not also shrink the window to 32 small packets."""
    if payload_bytes is None or payload_bytes <= 0:
        return DEFAULT_INFLIGHT_SLOTS
    return min(65536, max(DEFAULT_INFLIGHT_SLOTS,
                          DEFAULT_INFLIGHT_SLOTS * max_payload // payload_bytes))


def _start_aggregator(native: Any, args: argparse.Namespace) -> Tuple[Any, int]:
    """Start the native aggregator; with --port 0 find a port free for TCP and UDP."""
    attempts = 20 if args.port == 0 else 1
    last: Optional[Exception] = None
    for _ in range(attempts):
        port = args.port
        if port == 0:
            try:
                with socket.socket(family_of(args.host)) as probe:
                    probe.bind((args.host, 0))
                    port = probe.getsockname()[1]
            except (OSError, ValueError) as exc:
                raise NetReduceError(f"cannot listen on {format_address((args.host, 0))}: "
                                     f"{getattr(exc, 'strerror', None) or exc}") from None
        cap = native.MAX_PAYLOAD if args.payload_bytes is None else args.payload_bytes
        # The table holds --max-jobs admitted jobs and, beside them, the pending ones
        # (switch/pending.py): strangers' unfinished registrations cannot fill it.
        agg = native.Aggregator(**aggregator_args(
            host=args.host, port=port, slots=args.slots, payload_bytes=cap,
            max_jobs=args.max_jobs + Limits.pending_jobs, threads=args.threads,
            memory_limit=args.memory_mb << 20,
            fanout=args.fanout, group_base=args.group_base, transport=args.transport,
            xdp_device=args.xdp_device, xdp_mode=args.xdp_mode, xdp_fallback=args.xdp_fallback,
            data_nice=args.data_nice))
        try:
            agg.start()
            return agg, port
        except native.RefusedError as exc:  # AF_XDP refused (--no-xdp-fallback): no retry
            raise NetReduceError(f"cannot start on {format_address((args.host, port))}: "
                                 f"--transport xdp: {exc}") from None
        except Exception as exc:  # port taken: try another when picking
            last = exc
    raise NetReduceError(f"cannot start on {format_address((args.host, args.port))}: {last}")


def _nice_words(asked: int, applied: int) -> str:
    """The ready line's word on the data threads' priority (--data-nice)."""
    if asked == applied:
        return f", data threads at nice {applied}" if applied else ""
    return f", data threads at nice {applied} (--data-nice {asked} needs CAP_SYS_NICE)"


def _transport_words(agg) -> str:
    """What the ready line adds to the data path: a fallback from --transport xdp, and
    ports an XDP setup left on sockets, are logged as warnings naming the device and
    why (the daemon runs on: sockets carry everything AF_XDP would), as is a receive
    buffer the kernel capped (protocol/socket_buffers.py)."""
    info = agg.transport_info()
    buffer_note = receive_buffer_note(int(info.get("receive_buffer_bytes", 0)),
                                      int(info.get("receive_buffer_asked", 0)),
                                      "netreduce-switch data ports")
    if buffer_note:
        logging.warning("%s", buffer_note)
    for note in info["notes"]:
        logging.warning("--transport xdp: %s", note)
    if info["fallback"]:
        logging.warning("--transport xdp: using kernel UDP sockets instead: %s", info["fallback"])
        return "; xdp fell back to kernel sockets"
    if info["transport"] == "xdp" and len(info["ports"]) > 1:  # data_path names port 0's
        return "; then " + "; ".join(info["ports"][1:])
    return ""


def _raise_fd_limit() -> None:
    """One file descriptor per control connection: take the hard limit, so that
    thousands of connections (a large job's, or a flood's) do not exhaust it."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="netreduce-switch %(levelname)s %(message)s")
    from netreduce import _native  # here, not above: --help works without the native module

    _raise_fd_limit()
    args.slots = default_slots(args.payload_bytes, _native.MAX_PAYLOAD) if args.slots is None \
        else args.slots
    if args.require_secret and args.allow_open_jobs:
        print("netreduce-switch: --require-secret and --allow-open-jobs contradict each other",
              file=sys.stderr)
        return 2
    if args.tls_key and not args.tls_cert:
        print("netreduce-switch: --tls-key needs --tls-cert", file=sys.stderr)
        return 2
    # Secure by default: a daemon that other hosts can reach admits only jobs whose
    # ranks prove a secret, unless the operator says the network is trusted.
    beyond = not _loopback(args.host)
    require = args.require_secret or (beyond and not args.allow_open_jobs)
    try:
        operator = read_operator_secret(args.operator_secret_file) \
            if args.operator_secret_file else None
        keys = job_keys.read(args.job_secrets) if args.job_secrets else {}
        tls_ctx = tls.server_context(args.tls_cert, args.tls_key or args.tls_cert) \
            if args.tls_cert else None
        agg, port = _start_aggregator(_native, args)
        srv = ControlServer(
            args.host, port, agg, payload_explicit=args.payload_bytes is not None,
            guard=Guard(require_secret=require, operator_secret=operator, job_keys=keys,
                        beyond_loopback=beyond and not args.require_secret),
            limits=Limits(pending_idle_s=args.handshake_timeout, max_pending=args.max_pending,
                          max_jobs=args.max_jobs, pending_jobs_per_source=args.max_pending_jobs,
                          pending_job_s=args.pending_job_timeout,
                          finished_job_s=args.finished_job_s), tls=tls_ctx)
    except (NetReduceError, OSError, ValueError, ssl.SSLError) as exc:
        print(f"netreduce-switch: {exc}", file=sys.stderr)
        return 2
    try:  # two levels: rack_grant (spine), rack_job (with --spine)
        uplink.configure(srv, args.spine, args.uplink_rto_ms, args.uplink_drop_rate,
                         args.uplink_drop_results)
    except NetReduceError as exc:
        print(f"netreduce-switch: {exc}", file=sys.stderr)
        srv.server_close()
        agg.stop()
        return 2
    service.install()  # fell_back: refused jobs that went on elsewhere

    address = format_address((args.host, port))
    metrics = None
    if args.metrics_port is not None:
        from netreduce.switch import metrics as prometheus  # prometheus_client: only when asked for
        try:
            metrics = prometheus.MetricsServer(
                srv, args.metrics_host, args.metrics_port,
                info={"version": __version__, "address": address,
                      "fanout": args.fanout, "threads": str(args.threads)})
        except OSError as exc:
            print(f"netreduce-switch: cannot serve metrics on {args.metrics_host}:"
                  f"{args.metrics_port}: {exc}", file=sys.stderr)
            srv.server_close()
            agg.stop()
            return 2
        print(f"{METRICS_PREFIX}http://{metrics.host}:{metrics.port}/metrics", flush=True)

    # SIGTERM/SIGINT: graceful stop; SIGHUP: log status (netreduce/switch/service.py)
    # and re-read --job-secrets.
    life = service.Lifecycle()
    signal.signal(signal.SIGTERM, lambda signum, frame: life.on_stop("SIGTERM"))
    signal.signal(signal.SIGINT, lambda signum, frame: life.on_stop("SIGINT"))
    signal.signal(signal.SIGHUP, lambda signum, frame: life.on_status())
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    if args.allow_open_jobs and not _loopback(args.host):
        logging.getLogger("netreduce.switch").warning(
            "admitting jobs without a secret on %s (--allow-open-jobs): whoever reaches this "
            "port and knows a job's name may join or read it", address)
    print(f"{READY_PREFIX}{address} (udp {port}..{port + args.threads - 1}, "
          f"{args.slots} slots x {_payload_words(args.payload_bytes)}, max {args.max_jobs} jobs, "
          f"{args.fanout} fan-out, ICRC check {config.get('NETREDUCE_ICRC_CHECK')}, data path "
          f"{agg.data_path}{_transport_words(agg)}{_nice_words(args.data_nice, agg.data_nice)}; "
          f"job secrets "
          f"{'required' if require else 'optional'}{'; TLS' if tls_ctx else ''})", flush=True)
    while not life.stop.wait(0.2):
        if life.status_requested.is_set():
            life.status_requested.clear()
            service.log_status(srv, address)
            if args.job_secrets:
                job_keys.reload(srv.guard, args.job_secrets, logging.getLogger("netreduce.switch"))
    service.drain(srv, life, address, args.stop_timeout)
    if metrics is not None:
        metrics.close()
    agg.stop()
    service.log_status(srv, address, logging.INFO)  # final counters, for the journal
    return 0
