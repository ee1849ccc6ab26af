"""Where a server keeps its rows and their optimizer state: in memory, or in files.

`MemoryStorage`: ordinary tensors. `FileStorage`: every tensor of the shard is a
shared memory map of a file of its own in `strategy.shard_dir`, so a shard may be
larger than the memory of the job: the kernel's page cache is the working set (rows
a step touches are faulted in, cold ones written back and dropped under memory
pressure, a memory cgroup's limit included). The arithmetic is the same tensors'
(`index_add_` on a mapped tensor), so a run with files trains bit for bit as one in
memory.

Why pages and not PyTorch-BigGraph's partitions swapped to disk: a parameter
server answers any row at any step (workers draw batches over the whole graph, and
negatives are uniform over all entities), so a partition scheme would have to
reorder training into buckets, changing the model trained; the mapping keeps the
batches, and with them the equivalence with `local`. The price is a random read of a
page per cold row, which PBG's sequential partition loads avoid.

A file is created, mapped and unlinked at once: its blocks are freed when the server
ends, however it ends, and no other process can open it.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from pathlib import Path
from typing import Protocol

import numpy as np
import torch


class MemoryStorage:
    """Tensors in the process's memory."""

    def zeros(self, *shape: int) -> torch.Tensor:
        return torch.zeros(*shape)

    def empty(self, *shape: int) -> torch.Tensor:
        return torch.empty(*shape)

    def describe(self) -> str:
        return "in memory"


class FileStorage:
    """Tensors that are shared memory maps of unlinked files in `folder`."""

    def __init__(self, folder: Path, label: str) -> None:
        self.folder = folder
        self.label = label  # a prefix of the files' names (which server's)
        folder.mkdir(parents=True, exist_ok=True)
        self.bytes = 0

    def zeros(self, *shape: int) -> torch.Tensor:
        """A float32 tensor of `shape`, all zeros, in a file unlinked once it is mapped."""
        fd, name = tempfile.mkstemp(prefix=f"{self.label}-", suffix=".f32", dir=self.folder)
        os.close(fd)
        try:
            # rows are read at random: without MADV_RANDOM each fault reads ahead 128 KiB
            # and more around a row of a few KiB, and a working set smaller than the shard
            # turns into reading the file over and over
            tensor = zeros_file(Path(name), shape, random_reads=True)
        finally:
            os.unlink(name)  # the mapping keeps the blocks until it is dropped
        self.bytes += tensor.numel() * 4
        return tensor

    def empty(self, *shape: int) -> torch.Tensor:
        return self.zeros(*shape)

    def describe(self) -> str:
        return f"memory-mapped files in {self.folder} ({self.bytes / (1 << 20):.1f} MiB)"


def zeros_file(path: Path, shape: tuple[int, ...], *, random_reads: bool = False) -> torch.Tensor:
    """A float32 tensor of `shape`, all zeros: the file at `path` made (or emptied) at the
    size it needs, and mapped shared (a new file reads as zeros)."""
    count = int(np.prod(shape)) if shape else 1
    with open(path, "wb") as f:
        f.truncate(max(count, 1) * 4)
    return map_file(path, shape, random_reads=random_reads)


def map_file(path: Path, shape: tuple[int, ...], *, random_reads: bool = False) -> torch.Tensor:
    """A float32 tensor of `shape` that is a shared mapping of the file at `path`
    (`random_reads`: tell the kernel not to read ahead around a fault)."""
    count = int(np.prod(shape)) if shape else 1
    mapped = np.memmap(path, dtype=np.float32, mode="r+", shape=(max(count, 1),))
    if random_reads:
        mapped._mmap.madvise(mmap.MADV_RANDOM)  # type: ignore[attr-defined]
    return torch.from_numpy(mapped[:count]).view(*shape)


class ShardStorage(Protocol):
    """Where a shard's tensors live: in memory, in files, or shared on a host (host_rows.py)."""

    def zeros(self, *shape: int) -> torch.Tensor: ...

    def empty(self, *shape: int) -> torch.Tensor: ...

    def describe(self) -> str: ...
