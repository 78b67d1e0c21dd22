"""The exception types TensorFlow users catch, for netreduce's errors.

Horovod's kernels fail with a TensorFlow status, so its users catch
``tf.errors.FailedPreconditionError`` when ranks disagree about a tensor (shape,
dtype, root rank), ``tf.errors.InvalidArgumentError`` for a bad argument,
``tf.errors.UnknownError`` when the job broke. netreduce raises the same types:

* eagerly, as a class that is both the TensorFlow type and netreduce's own
  (``FailedPreconditionError`` here is a ``tf.errors.FailedPreconditionError`` and a
  ``netreduce.errors.NegotiationError``), with netreduce's message (it names the
  tensor, the shapes, the ranks) and attributes (``RankFailedError.rank``);
* in a graph (tf.function, a TF1 Session), the op's status carries the code of that
  same TensorFlow type (``status_code``) and the message, and TensorFlow raises its
  own class of that type: no Python object crosses the C++ kernel.
"""
from __future__ import annotations

from typing import Dict, Tuple, Type

import tensorflow as tf

from netreduce import errors as _core


_CODES = {tf.errors.UnknownError: tf.errors.UNKNOWN,
          tf.errors.FailedPreconditionError: tf.errors.FAILED_PRECONDITION,
          tf.errors.InvalidArgumentError: tf.errors.INVALID_ARGUMENT,
          tf.errors.DeadlineExceededError: tf.errors.DEADLINE_EXCEEDED,
          tf.errors.AbortedError: tf.errors.ABORTED,
          tf.errors.UnavailableError: tf.errors.UNAVAILABLE,
          tf.errors.UnimplementedError: tf.errors.UNIMPLEMENTED}


def _twin(tf_type: Type[tf.errors.OpError], core_type: Type[BaseException]) -> type:
    """A class deriving from both, built as TensorFlow's are: (node_def, op, message)."""
    code = _CODES[tf_type]

    def __init__(self, node_def=None, op=None, message: str = "", *args):
        # TensorFlow's own signature: AutoGraph re-creates an error raised while
        # tracing from (node_def, op, message), and keeps the type only then.
        # OpError.__init__ would call super().__init__() with no message, which
        # reaches netreduce's constructors; set what OpError's properties read.
        if isinstance(node_def, str) and op is None and not message:
            node_def, message = None, node_def  # netreduce's way: the message alone
        Exception.__init__(self, message)
        self._node_def, self._op, self._message = node_def, op, message
        self._error_code, self._experimental_payloads = code, {}

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        state = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        return type(self), (None, None, self.message), state

    cls = type(core_type.__name__, (tf_type, core_type),
               {"__init__": __init__, "__str__": __str__, "__reduce__": __reduce__,
                "__module__": __name__, "_nr_core": core_type, "_nr_tf": tf_type,
                "__doc__": f"{core_type.__doc__ or ''} Also a tf.errors.{tf_type.__name__}."})
    return cls


# The TensorFlow type of each netreduce error (the most specific entry wins).
NetReduceError = _twin(tf.errors.UnknownError, _core.NetReduceError)
FailedPreconditionError = _twin(tf.errors.FailedPreconditionError, _core.NegotiationError)
NegotiationError = FailedPreconditionError
InvalidArgumentError = _twin(tf.errors.InvalidArgumentError, _core.InvalidArgumentError)
InvalidTypeError = _twin(tf.errors.InvalidArgumentError, _core.InvalidTypeError)
OperationTimeoutError = _twin(tf.errors.DeadlineExceededError, _core.OperationTimeoutError)
ShutdownError = _twin(tf.errors.AbortedError, _core.ShutdownError)
RankFailedError = _twin(tf.errors.UnknownError, _core.RankFailedError)
DataPlaneError = _twin(tf.errors.UnknownError, _core.DataPlaneError)
ControlPlaneError = _twin(tf.errors.UnknownError, _core.ControlPlaneError)
AdmissionError = _twin(tf.errors.UnavailableError, _core.AdmissionError)
UnsupportedError = _twin(tf.errors.UnimplementedError, _core.UnsupportedError)
ConfigError = _twin(tf.errors.InvalidArgumentError, _core.ConfigError)

_TWINS: Tuple[type, ...] = (FailedPreconditionError, InvalidArgumentError, InvalidTypeError,
                            OperationTimeoutError, ShutdownError, RankFailedError,
                            DataPlaneError, ControlPlaneError, AdmissionError, UnsupportedError,
                            ConfigError, NetReduceError)
_BY_CORE: Dict[type, type] = {cls._nr_core: cls for cls in _TWINS}


def _twin_for(exc: BaseException):
    for klass in type(exc).__mro__:
        if klass in _BY_CORE:
            return _BY_CORE[klass]
    return None


def as_tf_error(exc: BaseException) -> BaseException:
    """``exc`` as the type TensorFlow users catch (itself if it already is one, or
    if it is not netreduce's). Adasum's UnsupportedError becomes its twin, still a
    NotImplementedError."""
    if isinstance(exc, tf.errors.OpError):
        return exc
    twin = _twin_for(exc)
    if twin is None:
        if isinstance(exc, ValueError):  # numpy's, say, about a tensor's value
            twin = InvalidArgumentError
        else:
            return exc
    converted = twin(None, None, str(exc))
    for key, value in vars(exc).items():  # RankFailedError.rank, ...
        setattr(converted, key, value)
    return converted


def status_code(exc: BaseException) -> int:
    """The TensorFlow status code (absl::StatusCode) for ``exc`` in a graph op."""
    if isinstance(exc, tf.errors.OpError):
        return int(exc.error_code)
    twin = _twin_for(exc)
    if twin is not None:
        return int(_CODES[twin._nr_tf])
    if isinstance(exc, NotImplementedError):
        return int(tf.errors.UNIMPLEMENTED)
    if isinstance(exc, (ValueError, TypeError)):
        return int(tf.errors.INVALID_ARGUMENT)
    return int(tf.errors.INTERNAL)


class convert:
    """``with convert():`` re-raises netreduce's errors as their TensorFlow twins (the
    eager path; the message and the original traceback are kept)."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or not isinstance(exc, Exception):
            return False
        converted = as_tf_error(exc)
        if converted is exc:
            return False
        raise converted.with_traceback(tb) from None
