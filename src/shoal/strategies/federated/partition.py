"""Which training samples each client holds.

A partition is a function of the config alone (its seed, the labels), so every
worker computes the same one without communicating, and a client's shard does not
depend on which worker hosts it. Each kind is registered under its config `kind`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from shoal.errors import ShoalError
from shoal.plugins.registry import closed_choice
from shoal.protocols.capabilities import CLASS_LABELS, CLIENT_FILES
from shoal.protocols.task import Task, rank_slice
from shoal.strategies.federated.config import (
    DirichletPartitionConfig,
    FilesPartitionConfig,
    IIDPartitionConfig,
)

#: (config, task, num_clients, hosted clients) -> {client: sample indices into the task}
Partitioner = Callable[[Any, Task, int, list[int]], dict[int, torch.Tensor]]


def iid_shards(num_samples: int, num_clients: int, seed: int) -> list[np.ndarray]:
    """A seeded shuffle cut into `num_clients` contiguous shards differing in size by <= 1."""
    order = np.random.default_rng([seed, num_samples]).permutation(num_samples)
    return [order[rank_slice(num_samples, c, num_clients)] for c in range(num_clients)]


def dirichlet_shards(
    labels: np.ndarray, num_clients: int, alpha: float, min_samples: int, seed: int
) -> list[np.ndarray]:
    """Label-skewed shards: class k's samples go to clients in proportions p_k ~ Dir(alpha).

    Redraws (with the same generator, so the result stays a function of the seed)
    until every client has at least `min_samples` samples.
    """
    rng = np.random.default_rng([seed, len(labels), num_clients])
    classes = np.unique(labels)
    for _ in range(100):
        shards: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for k in classes:
            members = rng.permutation(np.flatnonzero(labels == k))
            shares = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(members)).astype(np.int64)
            for client, part in enumerate(np.split(members, cuts)):
                shards[client].append(part)
        out = [np.sort(np.concatenate(parts)) for parts in shards]
        if min(len(s) for s in out) >= min_samples:
            return out
    raise ShoalError(
        f"strategy.partition: no Dirichlet(alpha = {alpha:g}) split of {len(labels)} samples "
        f"over {num_clients} clients gave every client >= {min_samples} samples in 100 draws; "
        "lower partition.min_samples or num_clients, or raise alpha"
    )


def partition_iid(
    config: IIDPartitionConfig, task: Task, n: int, hosted: list[int]
) -> dict[int, Any]:
    shards = iid_shards(task.train_size, n, config.seed)
    return {c: torch.from_numpy(shards[c]) for c in hosted}


def partition_dirichlet(
    config: DirichletPartitionConfig, task: Task, n: int, hosted: list[int]
) -> dict[int, Any]:
    labels = CLASS_LABELS.of(task, "federated").sample_labels()
    shards = dirichlet_shards(labels.numpy(), n, config.alpha, config.min_samples, config.seed)
    return {c: torch.from_numpy(shards[c]) for c in hosted}


def partition_files(
    config: FilesPartitionConfig, task: Task, n: int, hosted: list[int]
) -> dict[int, Any]:
    """Only the hosted clients' files are read: other clients' data never enters this worker."""
    counts = CLIENT_FILES.of(task, "federated").load_train_files(
        [config.clients[c].path for c in hosted]
    )
    out, start = {}, 0
    for client, count in zip(hosted, counts, strict=True):
        out[client] = torch.arange(start, start + count)
        start += count
    return out


def client_shards(
    config: Any, task: Task, num_clients: int, hosted: list[int]
) -> dict[int, torch.Tensor]:
    """The sample indices of each hosted client."""
    partition: Partitioner = PARTITIONS.load(config.kind)
    return partition(config, task, num_clients, hosted)


PARTITIONS = closed_choice(
    "partition kind",
    "kind",
    "shoal.strategies.federated.partition",
    "shoal.strategies.federated.config",
    {
        "iid": ("partition_iid", "IIDPartitionConfig"),
        "dirichlet": ("partition_dirichlet", "DirichletPartitionConfig"),
        "files": ("partition_files", "FilesPartitionConfig"),
    },
)
"""The partition kinds, by their config's `kind`."""
