"""A shared queue of work items: each rank takes the next one as soon as it is free.

The queue is a counter in the job's store (the one every rank joined the process
group through; no other transport): `take` is one atomic `add`, so two ranks never
get the same position, and a rank that finishes early simply takes more. The items
themselves are a list every rank computes alike (e.g. a round's clients, longest
first); the store hands out only positions in it.

A counter is a value read from the store, which any local process could reach: a
user of the queue must check afterwards, in a collective, that every item was taken
exactly once (federated rounds count who trained each client), so a forged value can
fail a round but never change a result silently.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed import distributed_c10d


class SharedQueue:
    """Positions 0, 1, 2, ... of the list named `key`, handed out once each."""

    def __init__(self, namespace: str) -> None:
        if not dist.is_initialized():
            raise RuntimeError("a shared queue needs the job's process group (and its store)")
        # torch keeps the store the default group was built from; the same on every rank
        self.store = distributed_c10d._get_default_store()
        self.namespace = namespace

    def take(self, key: str) -> int:
        """The next position of list `key` (0 for the first caller): one request to the
        store, which fails after the store's own timeout if the store is gone."""
        return int(self.store.add(f"shoal/queue/{self.namespace}/{key}", 1)) - 1
