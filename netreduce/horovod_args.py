"""Horovod's argument conventions that every framework adapter follows the same way."""
from __future__ import annotations

import warnings
from typing import Any, Optional

from .ops import Average, Sum
from netreduce.errors import InvalidArgumentError


def handle_average_backwards_compatibility(op: Any, average: Optional[bool]) -> Any:
    """The op a collective runs from Horovod's ``op=`` and its deprecated ``average=``
    (Horovod's errors and warning; Average when neither is given)."""
    if op is not None:
        if average is not None:
            raise InvalidArgumentError("The op parameter supersedes average. "
                             "Please provide only one of them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed "
                      "in v1.0", DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    return Average
