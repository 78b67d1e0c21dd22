"""Every error netreduce raises derives from NetReduceError.

Messages name what a user needs to act on: rank, tensor, aggregator address,
job, slot, the limit that was hit."""
from typing import Sequence


class NetReduceError(RuntimeError):
    """Base of every error netreduce raises. The error types of the rooms that have
    their own stay there (``TopologyError`` in algorithms/hosts.py, ``AuthError`` in
    protocol/auth.py, ``RequestError`` in switch/commands.py, ``LaunchError`` in
    launcher/spawn.py, ...), all derived from this; tests/unit/test_errors.py checks
    that every exception class of the package does, and that no builtin is raised
    bare. The native module's ``EngineError`` is the exception: the binding's own,
    turned into ``DataPlaneError`` where it crosses into Python
    (netreduce/worker/dataplane.py)."""


class DataPlaneError(NetReduceError):
    """The native data plane failed (timeout, aggregator unreachable, aborted)."""


class AdmissionError(NetReduceError):
    """The aggregator refused or could not admit a job / rank."""


class ControlPlaneError(NetReduceError):
    """The aggregator's control port failed or answered with an error."""


class RankFailedError(NetReduceError):
    """Another rank of the job died, disconnected or called shutdown(), and this
    rank's operation needed it: raised for that operation only (one in flight then,
    or submitted later), naming this rank, the job, the tensor and the aggregator.
    ``rank`` is the departed rank's number."""

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


class InvalidArrayError(InvalidTypeError, ValueError):
    """An array netreduce cannot reduce: not a numpy array, or of a dtype it does not
    carry (netreduce/ops.py: check_array, dtype_name). A TypeError, as Horovod raises
    there, and a ValueError, which the data plane (netreduce/worker/dataplane.py) raised
    for it: code that catches either keeps working."""


class ConfigError(NetReduceError, ValueError):
    """A knob (NETREDUCE_*), a launcher's variable, a daemon's flag or a file one of
    them names holds a value netreduce cannot use; the message names which. Also a
    ValueError, which these were before."""


class UnknownKnobError(NetReduceError, KeyError):
    """A name given as a knob is not one (``netreduce info`` lists them). Also a
    KeyError: a lookup that missed."""


class UnsupportedError(NetReduceError, NotImplementedError):
    """netreduce does not do this (Adasum, say); the message says what to use
    instead. Also a NotImplementedError, which these were before."""


def tensor_names(names: Sequence[str], limit: int = 5) -> str:
    """"tensor 'a'" or "tensors 'a', 'b' (+3 more)": how errors name what failed."""
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return f"tensor{'s' if len(names) > 1 else ''} {shown}{more}"
