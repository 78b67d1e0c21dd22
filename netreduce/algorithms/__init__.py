"""All-reduce algorithms behind one small interface (gloo keeps one file per
algorithm over the same context the same way).

The communicator hands a negotiated, fused buffer to ``Algorithm.allreduce`` and
knows nothing else; ``select.build`` chooses the algorithm once at init from the
host layout and NETREDUCE_ALGORITHM:

* ``flat`` (flat.py) — every rank streams its whole buffer through the aggregator.
* ``hierarchical`` (hierarchical.py) — reduce-scatter through shared memory inside
  each host, each local rank's shard through the aggregator (one sub-job per local
  rank index), all-gather through shared memory; no network on a single host.
"""
from netreduce.algorithms.base import Algorithm

__all__ = ["Algorithm"]
