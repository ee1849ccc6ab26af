"""Small collectives used around training: metric sums, strings and byte blobs.

Only tensors cross the wire. Byte blobs (RNG states, run names) travel as uint8
tensors and are decoded by their owners as JSON or UTF-8, never unpickled.
Without a process group (the `local` strategy) each helper is the identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist


class Peers(Protocol):
    """Who this process is among its peers (a WorkerContext is one)."""

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def distributed(self) -> bool: ...
    @property
    def comm_device(self) -> torch.device: ...


@dataclass
class World:
    """A `Peers` for collectives over the whole world before a WorkerContext exists (or
    outside one): just who this process is."""

    rank: int
    world_size: int
    comm_device: torch.device
    distributed: bool = True


def _group(ctx: Peers) -> Any:
    """The process group of `ctx`'s collectives (None: the default group, the world).

    Ranks 0..n-1 of a subgroup must be global ranks 0..n-1 (src/dst are global ranks)."""
    return getattr(ctx, "group", None)


def all_reduce_sum(ctx: Peers, values: Sequence[float]) -> list[float]:
    """Sum a few numbers over all ranks, in float64 so that counts stay exact."""
    tensor = torch.tensor(list(values), dtype=torch.float64, device=ctx.comm_device)
    if ctx.distributed and ctx.world_size > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=_group(ctx))
    return tensor.cpu().tolist()


def all_reduce_max(ctx: Peers, values: Sequence[float]) -> list[float]:
    tensor = torch.tensor(list(values), dtype=torch.float64, device=ctx.comm_device)
    if ctx.distributed and ctx.world_size > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=_group(ctx))
    return tensor.cpu().tolist()


def broadcast_bytes(ctx: Peers, data: bytes | None, src: int = 0) -> bytes:
    """Rank `src` sends `data`; every rank returns it."""
    if not (ctx.distributed and ctx.world_size > 1):
        return data or b""
    size = torch.tensor([len(data) if ctx.rank == src and data else 0], device=ctx.comm_device)
    dist.broadcast(size, src=src, group=_group(ctx))
    buffer = torch.zeros(int(size.item()), dtype=torch.uint8, device=ctx.comm_device)
    if ctx.rank == src and data:
        buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buffer, src=src, group=_group(ctx))
    return bytes(buffer.cpu().numpy().tobytes())


def gather_bytes(ctx: Peers, data: bytes) -> list[bytes]:
    """Every rank contributes `data`; every rank returns the list indexed by rank."""
    if not (ctx.distributed and ctx.world_size > 1):
        return [data]
    size = torch.tensor([len(data)], dtype=torch.int64, device=ctx.comm_device)
    sizes = [torch.zeros_like(size) for _ in range(ctx.world_size)]
    dist.all_gather(sizes, size, group=_group(ctx))
    longest = int(max(int(s.item()) for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8, device=ctx.comm_device)
    if data:
        padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(padded.device)
    blobs = [torch.zeros_like(padded) for _ in range(ctx.world_size)]
    dist.all_gather(blobs, padded, group=_group(ctx))
    return [
        bytes(blob[: int(s.item())].cpu().numpy().tobytes())
        for blob, s in zip(blobs, sizes, strict=True)
    ]


def barrier(ctx: Peers) -> None:
    if ctx.distributed and ctx.world_size > 1:
        dist.barrier(group=_group(ctx))


def gather_tensors(ctx: Peers, tensors: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Collective: every rank gives tensors of the same names, shapes and dtypes; rank 0 gets
    one dict per rank (on CPU), the other ranks an empty list."""
    if not (ctx.distributed and ctx.world_size > 1):
        return [{name: t.detach().cpu().clone() for name, t in tensors.items()}]
    gathered: list[dict[str, torch.Tensor]] = [{} for _ in range(ctx.world_size)]
    for name in sorted(tensors):
        tensor = tensors[name].detach().to(ctx.comm_device).contiguous()
        parts = [torch.empty_like(tensor) for _ in range(ctx.world_size)] if ctx.rank == 0 else None
        dist.gather(tensor, parts, dst=0, group=_group(ctx))
        if parts is not None:
            for rank, part in enumerate(parts):
                gathered[rank][name] = part.cpu()
    return gathered if ctx.rank == 0 else []
