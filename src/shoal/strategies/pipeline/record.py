"""The pipeline's model of record: the stages, run in turn across the ranks; no rank holds
the whole model.

Evaluation calls the model it is given as the task's `evaluate` calls its model
(`model(ids)`, or `model(input_ids=ids)`). :class:`StagedModel` is that call run through
the pipeline, forward only: every rank takes the same batch (the pipeline evaluates on
a view of the task over one rank, every rank every window), the rank of stage 0 runs
it and broadcasts the activation, the rank of stage 1 runs that, and so on; the last
stage's output is broadcast to every rank, which computes the same figures from it (no
reduction needed). Each broadcast carries a small header first (dtype and shape), so
batches of any length pass. The stages run in full precision, as the whole model did
(a hybrid mesh's run laid out, as they train: in the learner's precision).

The best model is each rank's own stages, copied to the CPU when validation finds it
best, put back for the test splits; a resumed run without one in memory reads its
stages from the best/ checkpoint (`load_stage`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shoal.checkpoint.marker import SHARDED_DIR, is_marker
from shoal.runtime.context import WorkerContext
from shoal.training.steps import LocalModel

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32]
_HEADER = 8  # dtype index, number of dimensions, up to 6 sizes


class StagedModel(nn.Module):
    """The full model's forward, each rank running its stages in turn (collective).

    It holds the model's own children (`whole`: values where this rank holds them, the
    meta device elsewhere), so its names, shapes and train / eval mode are the model's
    (a resume checks a checkpoint against them); the stages that run are `stages`."""

    def __init__(
        self, ctx: WorkerContext, whole: nn.Module, stages: dict[int, nn.Module], total: int,
        ranks: tuple[list[int], Any, int],
    ) -> None:  # fmt: skip
        super().__init__()
        for name, child in whole.named_children():
            self.add_module(name, child)
        for name, param in whole.named_parameters(recurse=False):
            self.register_parameter(name, param)
        for name, buf in whole.named_buffers(recurse=False):
            self.register_buffer(name, buf, name not in whole._non_persistent_buffers_set)
        self.ctx, self.total = ctx, total
        # the global rank at each pipeline position, their group, this rank's position
        self.sources, self.group, self.position = ranks
        self.held = stages  # stage index -> its module (full precision, unwrapped)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        h = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        device = h.device
        for index in range(self.total):
            holder = index % len(self.sources)
            mine = holder == self.position
            if mine:
                h = self.held[index](h)
            source = self.sources[holder]
            h = _broadcast(self.ctx, h if mine else None, source, self.group, device)
        return h


def _broadcast(
    ctx: WorkerContext, tensor: torch.Tensor | None, src: int, group: Any, device: torch.device
) -> torch.Tensor:
    """`tensor` from (global) rank `src` to every rank of `group` (header first: dtype and
    shape)."""
    comm = ctx.comm_device
    header = torch.zeros(_HEADER, dtype=torch.int64, device=comm)
    if tensor is not None:
        if tensor.dim() > _HEADER - 2 or tensor.dtype not in _DTYPES:
            raise ValueError(f"a stage's output of {tensor.dtype} {tuple(tensor.shape)}")
        header[0], header[1] = _DTYPES.index(tensor.dtype), tensor.dim()
        header[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape)
    dist.broadcast(header, src=src, group=group)
    dtype, dims = _DTYPES[int(header[0])], int(header[1])
    shape = [int(s) for s in header[2 : 2 + dims]]
    if tensor is not None:
        flat = tensor.detach().to(comm).contiguous()
    else:
        flat = torch.empty(shape, dtype=dtype, device=comm)
    dist.broadcast(flat, src=src, group=group)
    return flat.to(device)


class StagedRecord(LocalModel):
    """The model of record of a pipeline rank (see the module docstring): the model is the
    forward through every rank's stages, the best copy is of this rank's own."""

    def __init__(self, ctx: WorkerContext, stages: nn.Module, forward: StagedModel) -> None:
        super().__init__(ctx, forward)
        self.seat(stages, forward)

    def seat(self, stages: nn.Module, forward: StagedModel) -> None:
        """This rank's stages (the optimizer's modules) and the forward through them (again
        after a re-partition, whose blocks brought their best copies along)."""
        self.stages, self._model = stages, forward

    @property
    def kept(self) -> nn.Module:
        return self.stages

    def load_saved(self, state: Any, folder: Path) -> None:
        load_stage(self.stages, state, folder)


def load_stage(stages: nn.Module, state: Any, folder: Path) -> None:
    """This rank's stages from a checkpoint's `model`: its own tensors of the sharded pieces
    (collective), or of a plain state dict of the whole model."""
    if not is_marker(state):
        own = stages.state_dict()
        stages.load_state_dict({name: state[name] for name in own})
        return
    import torch.distributed.checkpoint as dcp

    from shoal.checkpoint.dcp_io import SafeReader

    target = {"model": stages.state_dict()}
    dcp.load(target, storage_reader=SafeReader(folder / SHARDED_DIR))
    stages.load_state_dict(target["model"])
