"""One call for "reduce, scaled or not": every algorithm's ``allreduce`` and
``allreduce_async`` take ``scale`` (netreduce/algorithms/base.py, the Algorithm
interface), so that the pipeline and group_message hand it over in one call. Only the
flat algorithm scales in the engine (``scales_results``); the others refuse any other
scale than 1.0 with an InvalidArgumentError naming themselves, before anything is
sent -- not a TypeError about an unexpected keyword."""
from __future__ import annotations

import inspect
import types

import numpy as np
import pytest

from netreduce.algorithms import Algorithm
from netreduce.algorithms.flat import Flat
from netreduce.algorithms.hierarchical import Hierarchical
from netreduce.algorithms.host_fallback import build as build_host_fallback
from netreduce.algorithms.multi_aggregator import MultiAggregator
from netreduce.errors import InvalidArgumentError
from netreduce.worker.failover import Failover
from tests.unit.fakes import FakeConn

ALGORITHMS = (Flat, Hierarchical, MultiAggregator, Failover)


def _params(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("cls", ALGORITHMS, ids=lambda c: c.name)
@pytest.mark.parametrize("method", ["allreduce", "allreduce_async"])
def test_every_algorithm_has_the_interface_signature(cls, method):
    assert _params(getattr(cls, method)) == _params(getattr(Algorithm, method))
    assert isinstance(cls.scales_results, bool)


def test_the_unit_tests_data_plane_has_it_too():
    assert _params(FakeConn.allreduce) == _params(Algorithm.allreduce)


class _Conn:
    """A data-plane connection that records what reaches it."""

    def __init__(self, port: int) -> None:
        self.address = ("127.0.0.1", port)
        self.calls: list = []

    def allreduce_async(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        raise AssertionError("a refused call reached the data plane")

    def close(self) -> None:
        pass


def _hierarchical(conns):
    layout = types.SimpleNamespace(rank=0, local_rank=0, local_size=1, labels=["h0"],
                                   host_index=0)
    return Hierarchical(conns[0], layout, native=None, shard=None)


def _host_fallback(conns):
    it = iter(conns)
    return build_host_fallback([c.address for c in conns], job="j", rank=1, size=2,
                               connect=lambda address, **_: next(it), connect_kw={})


def _failover(conns):
    # Its constructor starts the path's monitor threads over a rendezvous; the scale
    # is refused before any of that state is touched, so the bare object shows it.
    return Failover.__new__(Failover)


@pytest.mark.parametrize("make,name", [
    (_hierarchical, "hierarchical"),
    (lambda conns: MultiAggregator(conns), "multi-aggregator"),
    (_host_fallback, "host"),
    (_failover, "failover"),
])
@pytest.mark.parametrize("method", ["allreduce", "allreduce_async"])
def test_an_algorithm_without_engine_scaling_refuses_a_scale(make, name, method):
    conns = [_Conn(1), _Conn(2)]
    algo = make(conns)
    assert algo.name == name and algo.scales_results is False
    x = np.ones(8, np.float32)
    with pytest.raises(InvalidArgumentError,
                       match=f"^the {name} algorithm does not scale results \\(scale=0.5\\)"):
        getattr(algo, method)(x, None, op="sum", dtype=None, scale=0.5)
    assert (x == 1).all() and not any(c.calls for c in conns)  # nothing sent
