"""Horovod's ElasticSampler: the dataset split over the ranks of the current
membership, without the samples already processed this epoch."""
from __future__ import annotations

import math
import random

import torch.utils.data

from ..mpi_ops import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Like DistributedSampler, but it re-partitions the samples not yet processed
    this epoch over the new ranks after a reset (when it is part of a TorchState).
    Call ``record_batch`` after each batch and ``set_epoch`` at the end of an epoch.
    ``seed`` must be the same on every rank."""

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: a new order (with shuffle), nothing processed yet."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """``batch_size`` samples per rank were processed."""
        self.processed_num += batch_size * self.num_replicas

    def load_state_dict(self, state_dict) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def state_dict(self):
        return dict(epoch=self.epoch, processed_num=self.processed_num)

    def reset(self) -> None:
        """Partition what is left of the epoch over the current ranks."""
        self.num_replicas = size()
        self.rank = rank()
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        self.indices = self.remaining_indices[:]
        # pad to a multiple of the ranks, then every rank takes its stride
        self.indices += self.indices[:(self.total_size - len(self.indices))]
        self.indices = self.indices[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
