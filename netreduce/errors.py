"""Every error netreduce raises derives from NetReduceError.

Messages name what a user needs to act on: rank, tensor, aggregator address,
job, slot, the limit that was hit."""
from typing import Sequence


class NetReduceError(RuntimeError):
    """Base of every error netreduce raises."""


class DataPlaneError(NetReduceError):
    """The native data plane failed (timeout, aggregator unreachable, aborted)."""


class AdmissionError(NetReduceError):
    """The aggregator refused or could not admit a job / rank."""


class ControlPlaneError(NetReduceError):
    """The aggregator's control port failed or answered with an error."""


class RankFailedError(NetReduceError):
    """Another rank of the job died, disconnected or called shutdown() while this
    rank's operations still needed it. ``rank`` is that rank's number."""

    def __init__(self, message: str, rank: int = -1) -> None:
        super().__init__(message)
        self.rank = rank


class NegotiationError(NetReduceError):
    """The ranks disagreed about a tensor (shape, dtype, op, scale factor, root)."""


class ShutdownError(NetReduceError):
    """The operation was pending when this process called shutdown()."""


class OperationTimeoutError(NetReduceError, TimeoutError):
    """``wait(timeout)`` gave up before the operation finished; the operation itself
    is still in flight and may be waited for again. Also a TimeoutError, so code that
    catches the built-in keeps working."""


class InvalidArgumentError(NetReduceError, ValueError):
    """A call's argument has a value netreduce cannot take (an unknown op, a root rank
    outside the job, a duplicate tensor name, a non-contiguous array): nothing was
    submitted and nothing is lost. Also a ValueError, which Horovod raises there."""


class InvalidTypeError(NetReduceError, TypeError):
    """A call's argument has a type netreduce cannot take (an unsupported dtype, a
    tensor of another framework): nothing was submitted. Also a TypeError, as in
    Horovod."""


def tensor_names(names: Sequence[str], limit: int = 5) -> str:
    """"tensor 'a'" or "tensors 'a', 'b' (+3 more)": how errors name what failed."""
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return f"tensor{'s' if len(names) > 1 else ''} {shown}{more}"
