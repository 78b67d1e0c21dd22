"""Every error netreduce raises derives from NetReduceError.

Messages name what a user needs to act on: rank, tensor, aggregator address,
job, slot, the limit that was hit."""


class NetReduceError(RuntimeError):
    """Base of every error netreduce raises."""


class DataPlaneError(NetReduceError):
    """The native data plane failed (timeout, aggregator unreachable, aborted)."""


class AdmissionError(NetReduceError):
    """The aggregator refused or could not admit a job / rank."""


class ControlPlaneError(NetReduceError):
    """The aggregator's control port failed or answered with an error."""
