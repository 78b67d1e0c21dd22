"""What the kernel lets a data socket hold of received datagrams before it drops them.

A rank receives its whole window of results, and the aggregator every rank's window,
in bursts. Both ask for large SO_RCVBUF sizes (SO_RCVBUFFORCE); without CAP_NET_ADMIN
the kernel caps the ask at net.core.rmem_max (212,992 bytes by default), the excess of
every burst is dropped and resent, and nothing else fails: a 64 MiB all-reduce of 4
ranks on loopback took 1.48x as long, with the daemon capped too 2x (BENCHMARKS.md).
The ranks and netreduce-switch log `receive_buffer_note` once when it applies, and each rank reports
its buffer at admission so that the job's window fits the smallest (`slots_that_fit`)."""
from __future__ import annotations

from typing import Optional

from netreduce import _native

RMEM_MAX = "/proc/sys/net/core/rmem_max"


def size_words(n: float) -> str:
    """Bytes as KiB or MiB, for the warnings."""
    return f"{n / (1 << 20):.0f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


def rmem_max() -> Optional[int]:
    try:
        with open(RMEM_MAX) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


# Of SO_RCVBUF as read back, what a burst may fill: the kernel counts each datagram's
# whole buffers, not its bytes, and the rest is headroom for what lands mid-drain.
# Measured (BENCHMARKS.md, 12-03): a capped rank's 416 KiB took 5 loopback jumbo
# results (85 %) with no loss; the daemon's 128 MiB, filled by 4 ranks' GSO sends at
# MTU 9000 at once, lost 14,000-22,000 packets per 4 all-reduces at 85 % and 8 at 50 %.
# A rank whose socket does not coalesce (NETREDUCE_UDP_OFFLOAD without gro) holds each
# MTU-sized datagram in a buffer of its own, about 1.6x its bytes: testbed, MTU 1500,
# 4 capped ranks, 85 % still lost 1.3-1.6 million packets per 7 all-reduces.
RANK_SHARE = 0.85
PLAIN_RANK_SHARE = 0.4
DAEMON_SHARE = 0.5


def rank_share(coalesced: bool, payload_bytes: int) -> float:
    """RANK_SHARE, or PLAIN_RANK_SHARE for a rank that receives small datagrams one by
    one (jumbo ones, which never coalesce, cost about their bytes)."""
    return RANK_SHARE if coalesced or datagram_bytes(payload_bytes) * 2 > 65536 \
        else PLAIN_RANK_SHARE


def datagram_bytes(payload_bytes: int) -> int:
    """A RoCEv2 datagram's UDP payload: 32-byte header, padded payload, ICRC."""
    return int(_native.datagram_bytes(payload_bytes))


def slots_that_fit(receive_buffer: int, payload_bytes: int, share: float = RANK_SHARE) -> int:
    """How many datagrams of `payload_bytes` fit in `share` of a socket's buffer at
    once (0: no limit known). A job runs with a window no larger than its smallest
    rank's buffer holds (ranks with CAP_NET_ADMIN or a raised rmem_max hold thousands,
    more than any job's slots), and than its ranks' windows together fit in the
    daemon's (DAEMON_SHARE of its ports, shared by the job's ranks)."""
    if receive_buffer <= 0 or payload_bytes <= 0:
        return 0
    return max(1, int(receive_buffer * share) // datagram_bytes(payload_bytes))


def receive_buffer_note(got: int, asked: int, who: str) -> str:
    """'' when the socket got what it asked (the kernel reports twice the bytes set)
    or is no socket (got 0); else a warning naming `who`, both sizes and the fix."""
    if got <= 0 or got >= 2 * asked:
        return ""
    cap = rmem_max()
    capped = f"net.core.rmem_max ({cap:,} bytes)" if cap is not None else "net.core.rmem_max"
    return (f"{who}: UDP receive buffer {size_words(got / 2)}, not the {size_words(asked)} "
            f"asked: without CAP_NET_ADMIN the kernel caps it at {capped}, and bursts of "
            f"packets past it are dropped and resent (slower, still exact; a rank's job holds "
            f"its window to what the smallest rank buffer takes). Raise it on this host: "
            f"sysctl -w net.core.rmem_max={asked}")
