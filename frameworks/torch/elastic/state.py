"""Horovod's TorchState: a model, an optimizer, samplers and any other values, saved
at each commit, restored after a failure and synced from rank 0 after a reset."""
from __future__ import annotations

import copy
from typing import Any, Dict, List, Tuple

import torch

from netreduce.elastic import ObjectState

from ..functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from ..mpi_ops import rank
from .sampler import ElasticSampler


class TorchState(ObjectState):
    """``model`` and ``optimizer`` (either may be None) and keyword values: a
    torch.nn.Module, torch.optim.Optimizer or ElasticSampler gets its handler (state
    dicts), anything else is a plain value broadcast as a Python object. All of them
    are attributes of the state."""

    def __init__(self, model=None, optimizer=None, **kwargs: Any) -> None:
        kwargs.update(dict(model=model, optimizer=optimizer))
        self._handlers, kwargs = _get_handlers(kwargs)
        for name, handler in self._handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def __setattr__(self, name: str, value: Any) -> None:
        if hasattr(self, name) and name in self._handlers:
            self._handlers[name].set_value(value)
        super().__setattr__(name, value)


class StateHandler:
    def __init__(self, value: Any) -> None:
        self.value = value

    def save(self) -> None:
        raise NotImplementedError()

    def restore(self) -> None:
        raise NotImplementedError()

    def sync(self) -> None:
        raise NotImplementedError()

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()


class _StateDictHandler(StateHandler):
    """A model's or an optimizer's state: a copy of its state_dict() per commit."""

    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self._saved = copy.deepcopy(value.state_dict())

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)


class ModelStateHandler(_StateDictHandler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(_StateDictHandler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(StateHandler):
    def __init__(self, sampler: ElasticSampler) -> None:
        super().__init__(sampler)
        self._saved = copy.deepcopy(sampler.state_dict())

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))


_handler_registry: List[Tuple[type, type]] = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry() -> List[Tuple[type, type]]:
    return _handler_registry


def set_handler_registry(registry: List[Tuple[type, type]]) -> None:
    global _handler_registry
    _handler_registry = registry


def _get_handler(value: Any):
    for kind, handler in _handler_registry:
        if isinstance(value, kind):
            return handler(value)
    return None


def _get_handlers(kwargs: Dict[str, Any]):
    handlers, rest = {}, {}
    for key, value in kwargs.items():
        handler = _get_handler(value)
        if handler is not None:
            handlers[key] = handler
        else:
            rest[key] = value
    return handlers, rest
