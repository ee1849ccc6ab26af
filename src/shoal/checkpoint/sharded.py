"""Sharded model and optimizer state, through torch.distributed.checkpoint (DCP).

A model whose parameters are DTensors (tensor_parallel, fully_sharded, hybrid)
has no rank that holds it whole, so its parameters and optimizer state are not
gathered into state.pt: every rank writes its own pieces with `dcp.save` into
the folder `sharded/` of the checkpoint being assembled, *before* the folder is
renamed into place (:class:`ShardedFiles` is a collective file part; the
manager hashes every piece into meta.json like any other file). state.pt keeps
the marker ``{"sharded": "sharded"}`` under `model` and `optimizer`, and the
rest of the state (schedule, data position, RNGs) as usual.

DCP saves by fully-qualified parameter name and global shape, so a checkpoint
loads into any layout of the same model:

- sharded -> sharded (same or another mesh or strategy): `dcp.load` reads each
  rank's pieces of the current layout (:class:`ShardedModelPart`);
- plain (local, data_parallel) -> sharded: the full tensors of state.pt are
  scattered into the current shards (`full_state_dict=True`), the optimizer's
  state renamed from torch's parameter indices to parameter names;
- sharded -> plain: every rank reads the whole tensors from `sharded/`
  (:func:`read_full`), the optimizer's state renamed back to indices.

:func:`export_model` turns either kind into one plain state dict file that
`TransformerLM.load_state_dict` (or any `nn.Module`) takes without shoal.

DCP's `.metadata` file is a pickle; it is read with an unpickler that builds
only DCP's own metadata classes, torch sizes and dtypes (:class:`SafeReader`),
so a checkpoint never runs code, as `torch.load(weights_only=True)` ensures for
state.pt.

The DCP code itself lives in :mod:`shoal.checkpoint.dcp_io`, imported only when a
sharded model or checkpoint is in use (it costs every process that imports it 0.7 s).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from shoal.checkpoint.integrity import load_tensors
from shoal.checkpoint.marker import MARKER, SHARDED_DIR, is_marker
from shoal.runtime.dtensors import is_dtensor

__all__ = [
    "MARKER",
    "SHARDED_DIR",
    "export_model",
    "is_marker",
    "is_sharded",
    "load_model",
    "load_plain_optimizer",
    "plain_model_state",
    "read_full",
    "sharded_part",
]

if TYPE_CHECKING:
    from shoal.checkpoint.dcp_io import ShardedModelPart


def is_sharded(model: nn.Module) -> bool:
    """True when some parameter is a DTensor (no rank holds the model whole)."""
    return any(is_dtensor(p) for p in model.parameters())


def sharded_part(model: nn.Module, optimizer: torch.optim.Optimizer) -> ShardedModelPart | None:
    """The checkpoint part of a sharded model's parameters and optimizer state (None for a
    plain model, whose state goes into state.pt)."""
    if not is_sharded(model):
        return None
    from shoal.checkpoint.dcp_io import ShardedModelPart

    return ShardedModelPart(model, optimizer)


def read_full(folder: Path, keys: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The whole `{"model": ..., "optimizer": ...}` of a sharded checkpoint, as plain
    tensors, read by this process alone (no collective); `keys`: only those entries."""
    from shoal.checkpoint.dcp_io import read_full_state

    return read_full_state(folder, keys)


def plain_model_state(folder: Path, state: Any) -> dict[str, torch.Tensor]:
    """A checkpoint's model as a plain state dict: from state.pt, or read whole from DCP
    (the model's pieces only, not the optimizer's)."""
    if is_marker(state):
        return dict(read_full(folder, ("model",))["model"])
    return dict(state)


def export_model(checkpoint: Path, out: Path) -> int:
    """Write checkpoint `checkpoint`'s model as one plain state dict file (`torch.save`);
    returns the number of tensors. The checkpoint is verified first."""
    from shoal.checkpoint.integrity import verified_meta

    verified_meta(checkpoint)
    state = load_tensors(checkpoint, "state.pt")
    model = plain_model_state(checkpoint, state.get("model", {}))
    torch.save(model, out)
    return len(model)


def load_model(model: nn.Module, state: Any, folder: Path) -> None:
    """Load a checkpoint's `model` (state.pt's entry; `folder` the checkpoint) into `model`,
    sharded or not, whichever kind of checkpoint it is (collective for a sharded model)."""
    if not is_sharded(model):
        model.load_state_dict(plain_model_state(folder, state))
        return
    from shoal.checkpoint.dcp_io import load_sharded_model

    load_sharded_model(model, state, folder)


def load_plain_optimizer(
    optimizer: torch.optim.Optimizer, model: nn.Module, state: Any, folder: Path
) -> None:
    """Load a checkpoint's `optimizer` into the optimizer of a plain model."""
    if is_marker(state):
        from shoal.checkpoint.dcp_io import by_index

        state = by_index(read_full(folder)["optimizer"], model, optimizer)
    optimizer.load_state_dict(state)
