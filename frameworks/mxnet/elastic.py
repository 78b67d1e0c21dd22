"""netreduce.mxnet.elastic: elastic training for MXNet Gluon (Horovod 0.28 has none
for MXNet; this is horovod.torch.elastic's shape): ``MXNetState`` and ``run``.

    state = hvd.elastic.MXNetState(net.collect_params(), trainer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, EPOCHS):
            ...  # forward, backward, trainer.step(batch_size)
            state.commit()

Under an elastic netreduce-run (docs/elastic.md) a rank dying or hosts coming and
going rolls every rank back to its last ``commit()``, the job continues at its new
size, and the state is synced from the new rank 0: the parameters, the trainer's
optimizer states and update counts, and the keyword values. ``DistributedTrainer``
averages over the ranks of the moment, so nothing else changes with the size;
rescale the learning rate in a reset callback if it should follow the size."""
from __future__ import annotations

import pickle
from typing import Any, Dict, Optional

import mxnet as mx

from netreduce import elastic as _elastic
from netreduce.elastic import HostsUpdatedInterrupt, ObjectState, State  # noqa: F401

from .mpi_ops import broadcast_object, rank
from .trainer import broadcast_parameters


def run(func):
    """Run ``func(state, ...)`` elastically (Horovod's decorator): on a broken job or
    a host update, reset to the new membership, restore and sync ``state``, run again."""
    return _elastic.run_fn(func)


def _param_dict(params: Any) -> Dict[str, Any]:
    """{name: Parameter} of ``params``: a ParameterDict, a dict, or a Block."""
    if isinstance(params, mx.gluon.Block):
        params = params.collect_params()
    return dict(sorted(params.items()))


class MXNetState(ObjectState):
    """``params`` (a Block, its ParameterDict, or a dict of Parameters), ``trainer`` (a
    gluon.Trainer, e.g. DistributedTrainer: its optimizer states and update counts),
    and keyword values, exposed as attributes. ``params`` must be initialized."""

    def __init__(self, params: Any = None, trainer: Optional[mx.gluon.Trainer] = None,
                 **kwargs: Any) -> None:
        self.params = _param_dict(params) if params is not None else {}
        self.trainer = trainer
        self._saved_params: Dict[str, Any] = {}
        self._saved_trainer: Optional[bytes] = None
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        for name, p in self.params.items():
            p.set_data(self._saved_params[name].copy())
        self._load_trainer(self._saved_trainer)
        super().restore()

    def sync(self) -> None:
        if self.params:
            broadcast_parameters(self.params, root_rank=0, prefix="elastic.")
        if self.trainer is not None:
            self._load_trainer(broadcast_object(self._trainer_states(), 0,
                                                name="elastic.trainer"))
        self._save_model()
        super().sync()

    def _save_model(self) -> None:
        self._saved_params = {name: p.data().copy() for name, p in self.params.items()}
        self._saved_trainer = self._trainer_states()

    def _trainer_states(self) -> Optional[bytes]:
        """The trainer's optimizer states (momentum, ...) and update counts, pickled."""
        if self.trainer is None:
            return None
        updater = self.trainer._updaters[0]
        opt = self.trainer._optimizer
        return pickle.dumps((updater.get_states(dump_optimizer=False),
                             dict(opt._index_update_count), opt.num_update))

    def _load_trainer(self, blob: Optional[bytes]) -> None:
        if self.trainer is None or blob is None:
            return
        states, counts, num_update = pickle.loads(blob)
        for updater in self.trainer._updaters:
            updater.set_states(states)
        opt = self.trainer._optimizer
        opt._index_update_count.clear()  # the optimizer's own dict: others refer to it
        opt._index_update_count.update(counts)
        opt.num_update = num_update


__all__ = ["MXNetState", "run", "ObjectState", "State", "HostsUpdatedInterrupt"]
