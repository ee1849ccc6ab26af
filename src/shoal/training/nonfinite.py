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
without a collective of its own, and, for a model laid out over the ranks (a
pipeline, a mesh), each rank's share of the squared gradient norm: clipping by
the global norm then costs no collective of its own either (`agree_on_step`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

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
    """Names whose tensor holds a NaN or an Inf (`GradientCheck`)."""
    return GradientCheck(named).read()[0]


class GradientCheck:
    """A step's gradients checked for NaN and Inf in one fused pass and one look from the
    host, however many tensors there are.

    The pass is a norm per tensor (`torch._foreach_norm`, as torch's own clipping; a NaN
    or an Inf anywhere makes it non-finite), per device and dtype, left on the device;
    `read` brings their finiteness (and the squared norm, if asked) to the host in one
    transfer. Checked one by one, each tensor cost a reduction and a wait for the device:
    on a GPU, 36 waits a step for the small lm, each one draining the queue that the host
    had filled ahead. A tensor whose norm is not finite is then checked entry by entry
    (its squares may have overflowed: entries beyond ~1e19 in float32).
    """

    def __init__(self, named: Iterable[tuple[str, torch.Tensor | None]]) -> None:
        self.names: list[str] = []
        #: sparse gradients by name: their values are checked as they stand (finite or not
        #: whether or not an index repeats), but a norm needs them coalesced (values summed
        #: where an index repeats), which costs a sort (~40x the norms' pass): `_whole`
        self._sparse: dict[str, torch.Tensor] = {}
        entries: list[tuple[str, torch.Tensor]] = []
        for name, tensor in named:
            if tensor is None:
                continue
            self.names.append(name)
            if tensor.is_sparse:
                self._sparse[name] = tensor
                tensor = tensor._values()
            entries.append((name, tensor))
        self._groups = _norms_by_kind(entries)
        self._square: torch.Tensor | None = None

    def _whole(self) -> list[tuple[str, torch.Tensor]]:
        """Each tensor as its norm must see it: a sparse one by its coalesced values."""
        return [
            (name, self._sparse[name].coalesce()._values() if name in self._sparse else values)
            for group, _ in self._groups
            for name, values in group
        ]

    def square(self) -> torch.Tensor:
        """The squared 2-norm of all the tensors together (float64, on their device), not
        yet read by the host."""
        if self._square is None:
            groups = _norms_by_kind(self._whole()) if self._sparse else self._groups
            parts = [norms.double().pow(2).sum() for _, norms in groups]
            device = parts[0].device if parts else torch.device("cpu")
            self._square = torch.zeros((), dtype=torch.float64, device=device)
            for part in parts:
                self._square = self._square + part.to(device)
        return self._square

    def read(self, with_square: bool = False) -> tuple[list[str], float | None]:
        """One transfer: the names of the tensors holding a NaN or an Inf, and (with
        `with_square`) the `square()` as a float; where only an overflowed norm made the
        square look infinite, it is summed again, entry by entry, in float64."""
        figures = [torch.isfinite(norms).all().double() for _, norms in self._groups]
        if with_square:
            figures.append(self.square())
        if not figures:
            return [], 0.0 if with_square else None
        device = figures[-1].device
        values = torch.stack([f.to(device) for f in figures]).tolist()
        bad: set[str] = set()
        for (group, norms), ok in zip(self._groups, values, strict=False):
            if ok:
                continue
            flags = torch.isfinite(norms).tolist()
            bad.update(
                name
                for (name, tensor), finite in zip(group, flags, strict=True)
                if not finite and not bool(torch.isfinite(tensor).all())
            )
        square = values[-1] if with_square else None
        if square is not None and not bad and not math.isfinite(square):
            square = sum(float(t.double().pow(2).sum()) for _, t in self._whole())
        return [name for name in self.names if name in bad], square


@dataclass(frozen=True)
class Agreement:
    """What every rank agreed on after a step's gradients were combined."""

    #: {rank: parameter names} of every rank whose local gradients were not finite
    nonfinite: dict[int, list[str]]
    #: the global gradient norm, when each rank gave its share of the squared norm
    norm: float | None = None


def agree_on_nonfinite(local: list[str], device: torch.device) -> dict[int, list[str]]:
    """Collective: {rank: parameter names} of every rank whose local gradients were not finite.

    Also agrees on a stop request: the agreed signal is left in `STOP` for the loop."""
    return agree_on_step(local, device).nonfinite


def agree_on_step(
    local: list[str], device: torch.device, square: torch.Tensor | None = None
) -> Agreement:
    """Collective: agree on non-finite gradients and stop requests (`agree_on_nonfinite`)
    and, when `square` is given, sum each rank's share of the squared gradient norm, in one
    all-reduce of a float64 vector: a flag and a signal number per rank (exact in float64),
    then the shares' sum. `square` must be a share such that the shares of all ranks add up
    to the whole model's squared norm (`training/clipping.py norm_share`)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        STOP.record_agreement([STOP.signum])
        rank = 0 if not dist.is_initialized() else dist.get_rank()
        norm = None if square is None else math.sqrt(float(square))
        return Agreement({rank: local} if local else {}, norm)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    comm_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
    shared = torch.zeros(2 * world_size + 1, dtype=torch.float64, device=comm_device)
    shared[rank] = 1.0 if local else 0.0  # the first world_size: non-finite gradients
    shared[world_size + rank] = float(STOP.signum)  # then the stop signals
    if square is not None:
        shared[-1] = square.to(comm_device, torch.float64)
    dist.all_reduce(shared)
    values = shared.tolist()
    norm = None if square is None else math.sqrt(max(values[-1], 0.0))
    flags, signals = values[:world_size], values[world_size : 2 * world_size]
    return Agreement(agreed_from(local, device, flags, signals), norm)


def agreed_from(
    local: list[str], device: torch.device, flags: list[float], signals: list[float]
) -> dict[int, list[str]]:
    """What every rank agreed on, from the summed slots of a collective (each rank wrote
    its flag and its stop signal in its own slot): the stop is left in `STOP`; the names
    are gathered (a collective) only when some rank's flag is up, which every rank sees."""
    STOP.record_agreement([int(v) for v in signals])
    if not any(flags):
        return {}
    rank, world_size = dist.get_rank(), dist.get_world_size()
    comm_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
    blobs = gather_bytes(World(rank, world_size, comm_device), "\n".join(local).encode())
    return {r: blob.decode().split("\n") for r, blob in enumerate(blobs) if flags[r]}


def describe_nonfinite(
    bad: dict[int, list[str]], who: Callable[[int], str] | None = None, limit: int = 4
) -> str:
    """'rank 2 (fc.weight, fc.bias)'; several ranks joined by '; '. `who` names a rank
    (a pipeline's: 'rank 1 (pipeline stage 1)')."""
    parts = []
    for rank in sorted(bad):
        names = bad[rank]
        more = f" and {len(names) - limit} more" if len(names) > limit else ""
        shown = ", ".join(names[:limit]) + more
        parts.append(f"{who(rank) if who else f'rank {rank}'} ({shown})")
    return "; ".join(parts)


def _norms_by_kind(
    entries: list[tuple[str, torch.Tensor]],
) -> list[tuple[list[tuple[str, torch.Tensor]], torch.Tensor]]:
    """The non-empty tensors grouped by device and dtype, each group with its tensors'
    norms stacked (one `torch._foreach_norm` per group)."""
    groups: dict[tuple[torch.device, torch.dtype], list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in entries:
        if tensor.numel():
            groups.setdefault((tensor.device, tensor.dtype), []).append((name, tensor))
    return [
        (group, torch.stack(torch._foreach_norm([tensor for _, tensor in group])))
        for group in groups.values()
    ]
