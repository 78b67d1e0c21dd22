"""horovod.torch.elastic on netreduce: ``TorchState``, ``ElasticSampler`` and ``run``.

``@hvd.elastic.run`` runs a training function that survives ranks dying and hosts
coming and going under an elastic netreduce-run (``--min-np``/``--max-np``/
``--host-discovery-script``): when the job changes, every rank rolls back to its
last ``state.commit()``, the job continues at its new size, and the state is synced
from the new rank 0. netreduce/elastic.py has the loop; docs/elastic.md the whole story.
"""
from netreduce import elastic as _elastic
from netreduce.elastic import HostsUpdatedInterrupt, ObjectState, State  # noqa: F401

from .sampler import ElasticSampler
from .state import TorchState


def run(func):
    """Run ``func(state, ...)`` elastically (Horovod's decorator): on a broken job or a
    host update, reset to the new membership, restore and sync ``state``, run again.
    Collectives must not be the first thing ``func`` does outside ``state``'s sync
    (new workers would run them while the others sync: Horovod's rule too)."""
    return _elastic.run_fn(func)


__all__ = ["TorchState", "ElasticSampler", "run", "ObjectState", "State",
           "HostsUpdatedInterrupt"]
