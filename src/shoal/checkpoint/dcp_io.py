"""The DCP side of sharded checkpoints (see :mod:`shoal.checkpoint.sharded`).

Importing torch.distributed.checkpoint takes DTensor, torch.fx and sympy with it: about
0.7 s, paid by every launcher and worker that imported it. Only a model whose parameters
are DTensors needs it, so this module is imported when one is in use, and
:mod:`shoal.checkpoint.sharded` stays light for every other strategy.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from shoal.checkpoint.integrity import CorruptCheckpoint
from shoal.checkpoint.marker import MARKER, SHARDED_DIR, is_marker


class ShardedFiles:
    """The collective file part: every rank saves its pieces of model and optimizer."""

    collective = True

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def write_files(self, folder: Path) -> dict[str, str]:
        state = {
            "model": get_model_state_dict(self.model),
            "optimizer": get_optimizer_state_dict(self.model, self.optimizer),
        }
        try:
            dcp.save(state, checkpoint_id=folder / SHARDED_DIR)
        except CheckpointException as exc:
            raise _write_failed(exc) from _first_failure(exc)
        return {}  # the manager hashes every piece, whichever rank wrote it

    def written(self) -> None:
        """Nothing to wait for: `dcp.save` ends once every rank's pieces are written."""


class ShardedWriteFailed(RuntimeError):
    """DCP could not write a rank's pieces (its CheckpointException, made an Exception)."""


def _first_failure(exc: CheckpointException) -> BaseException | None:
    """The first rank's own error (a full disk's OSError), the chain's cause: `space.py`
    reads ENOSPC off the chain."""
    for _, (error, _trace) in sorted(exc.failures.items()):
        return error
    return None


def _write_failed(exc: CheckpointException) -> ShardedWriteFailed:
    """DCP's CheckpointException derives from BaseException, which a worker's error report
    (any Exception) let through: the rank died with a traceback and no report, and the
    job ended 'exited with code 1 without an error report'. The first failure, in one line."""
    first = _first_failure(exc)
    ranks = ", ".join(map(str, sorted(exc.failures)))
    said = f"{type(first).__name__}: {first}" if first is not None else "no failure named"
    return ShardedWriteFailed(f"the sharded pieces were not written (ranks {ranks}): {said}")


class ShardedModelPart:
    """`model` of a sharded learner: the marker in state.pt, the pieces in `sharded/`."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        self.loaded_optimizer: dict[str, Any] | None = None  # read with the model

    def state_dict(self) -> dict[str, str]:
        return dict(MARKER)

    def files(self) -> ShardedFiles:
        """The file part that writes this model's pieces into a checkpoint folder."""
        return ShardedFiles(self.model, self.optimizer)

    def load_state_dict(self, state: Any) -> None:
        raise RuntimeError("a sharded model loads with its checkpoint folder (load_from)")

    def load_from(self, state: Any, folder: Path) -> None:
        if is_marker(state):
            model = get_model_state_dict(self.model)
            optimizer = get_optimizer_state_dict(self.model, self.optimizer)
            target: dict[str, Any] = {"model": model, "optimizer": optimizer}
            dcp.load(target, storage_reader=SafeReader(folder / SHARDED_DIR))
            set_model_state_dict(self.model, model)
            self.loaded_optimizer = dict(optimizer)
            return
        full = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.model, state, options=full)
        self.loaded_optimizer = None

    def load_optimizer(self, state: Any) -> None:
        """After `load_from`: the optimizer state read with the model, or a plain one."""
        if is_marker(state):
            assert self.loaded_optimizer is not None, "the model part loads first"
            set_optimizer_state_dict(self.model, self.optimizer, self.loaded_optimizer)
            self.loaded_optimizer = None
            return
        named = by_name(state, self.model, self.optimizer)
        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(self.model, self.optimizer, named, options=options)


def param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the order of the optimizer's groups (torch's state indices)."""
    names = {id(p): name for name, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def by_name(
    state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """torch's optimizer state dict (keyed by index) keyed by parameter name instead."""
    names = param_names(model, optimizer)
    return {
        "state": {names[int(i)]: value for i, value in state["state"].items()},
        "param_groups": [
            {**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]
        ],
    }


def by_index(
    state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """A name-keyed optimizer state dict (DCP's) keyed by torch's indices for `optimizer`."""
    names = param_names(model, optimizer)
    index = {name: i for i, name in enumerate(names)}
    groups = state["param_groups"]
    if len(groups) == 1 and len(optimizer.param_groups) == 1:
        # one group holds every parameter. The ranks of a pipeline each save their own
        # stage's group under the same key, of which DCP keeps one copy: its names are
        # not all of them
        groups = [{**groups[0], "params": names}]
    return {
        "state": {index[name]: value for name, value in state["state"].items()},
        "param_groups": [
            {**g, "params": sorted(index[name] for name in g["params"])} for g in groups
        ],
    }


def read_full_state(folder: Path, keys: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The whole `{"model": ..., "optimizer": ...}` of a sharded checkpoint, as plain
    tensors, read by this process alone (no collective); `keys`: only those entries (the
    model alone is a third of a checkpoint trained with Adam)."""
    state: dict[str, Any] = {}
    _load_state_dict(
        state,
        storage_reader=SafeReader(folder / SHARDED_DIR),
        planner=_EmptyStateDictLoadPlanner(keys=list(keys) if keys is not None else None),
        no_dist=True,
    )
    return state


def load_sharded_model(model: nn.Module, state: Any, folder: Path) -> None:
    """Load a checkpoint's `model` into a sharded `model` (collective): its own pieces from
    DCP, or the full tensors of a plain checkpoint scattered into the current shards."""
    if is_marker(state):
        target = {"model": get_model_state_dict(model)}
        dcp.load(target, storage_reader=SafeReader(folder / SHARDED_DIR))
        set_model_state_dict(model, target["model"])
    else:
        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


class SafeReader(FileSystemReader):
    """DCP's file reader whose metadata unpickler builds DCP's metadata classes only."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / ".metadata"
        try:
            with open(path, "rb") as handle:
                metadata = _MetadataUnpickler(handle).load()
        except FileNotFoundError:
            raise CorruptCheckpoint(path.parent.parent, f"{path} is missing") from None
        except pickle.UnpicklingError as exc:
            raise CorruptCheckpoint(path.parent.parent, f"{path}: {exc}") from None
        if not isinstance(metadata, Metadata):
            raise CorruptCheckpoint(path.parent.parent, f"{path} is not DCP metadata")
        storage = metadata.storage_meta or StorageMeta()
        storage.load_id = self.load_id
        metadata.storage_meta = storage
        return metadata


_ALLOWED = {
    ("torch", "Size"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "torch.distributed.checkpoint.metadata" or (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refuses to build {module}.{name}")
