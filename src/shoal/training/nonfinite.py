"""Finding non-finite gradients and agreeing on them across ranks (seed 004's "Jidoka").

A NaN or Inf in one rank's gradient poisons every replica as soon as it is
summed, and an optimizer step then writes it into the parameters. So each rank
inspects its *local* gradients before they are combined (bucket by bucket, as
they are handed to communication), and after the combination all ranks agree,
with one small all-reduce of a flag per rank, on whether anyone saw one. Then
every rank takes the same decision (halt, or skip the step) and the message can
name the ranks and parameters at fault: the names are gathered as UTF-8 bytes
only on that rare path.

The same all-reduce carries each rank's stop request (a SIGTERM or SIGINT it
received, `runtime/stop.py`), so every rank learns of a stop at the same step
without a collective of its own.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

from shoal.runtime.collectives import World, gather_bytes
from shoal.runtime.stop import STOP


def is_finite(tensor: torch.Tensor) -> bool:
    """True if every entry is finite. One summing pass: NaN and Inf propagate into the sum,
    and only if the sum is not finite (or overflowed) are the entries checked one by one."""
    if tensor.numel() == 0 or bool(torch.isfinite(tensor.sum())):
        return True
    return bool(torch.isfinite(tensor).all())


def nonfinite_names(named: Iterable[tuple[str, torch.Tensor | None]]) -> list[str]:
    """Names whose tensor holds a NaN or an Inf."""
    return [name for name, tensor in named if tensor is not None and not is_finite(tensor)]


def agree_on_nonfinite(local: list[str], device: torch.device) -> dict[int, list[str]]:
    """Collective: {rank: parameter names} of every rank whose local gradients were not finite.

    Also agrees on a stop request: the agreed signal is left in `STOP` for the loop."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        STOP.record_agreement([STOP.signum])
        return {0 if not dist.is_initialized() else dist.get_rank(): local} if local else {}
    rank, world_size = dist.get_rank(), dist.get_world_size()
    comm_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
    shared = torch.zeros(2, world_size, dtype=torch.int32, device=comm_device)
    shared[0, rank] = 1 if local else 0  # row 0: non-finite gradients; row 1: stop signal
    shared[1, rank] = STOP.signum
    dist.all_reduce(shared)
    STOP.record_agreement(shared[1].tolist())
    flags = shared[0]
    if not bool(flags.any()):
        return {}
    peers = World(rank, world_size, comm_device)
    blobs = gather_bytes(peers, "\n".join(local).encode())
    return {r: blob.decode().split("\n") for r, blob in enumerate(blobs) if flags[r]}


def describe_nonfinite(bad: dict[int, list[str]], limit: int = 4) -> str:
    """'rank 2 (fc.weight, fc.bias)'; several ranks joined by '; '."""
    parts = []
    for rank in sorted(bad):
        names = bad[rank]
        more = f" and {len(names) - limit} more" if len(names) > limit else ""
        shown = ", ".join(names[:limit]) + more
        parts.append(f"rank {rank} ({shown})")
    return "; ".join(parts)
