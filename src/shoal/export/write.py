"""The files of an export, written into a temporary path beside the target and renamed
into place: a reader finds the whole export or nothing, never half of one.

- `safetensors`: one `model.safetensors` (`safetensors.torch.save_file`): every tensor
  once (safetensors stores no two names of one memory: a tied weight is written under its
  first name, the others listed in the metadata under `shoal.tied`), with metadata naming
  the run, the checkpoint, its step and shoal's version.
- `hf`: the folder `save_pretrained` of the run's Hugging Face class writes (config.json,
  generation_config.json, model.safetensors), from the model on the meta device and the
  checkpoint's weights, plus `shoal-export.json` with the same provenance.

A write that fails on a full disk (or a folder it may not write) is one line naming it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shoal.checkpoint.atomic import fsync_dir, fsync_file
from shoal.checkpoint.space import disk_full, exception_chain
from shoal.errors import ShoalError

PROVENANCE_FILE = "shoal-export.json"


def written_once(
    state: dict[str, torch.Tensor], tied: dict[str, str]
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """`state` with every tensor once: the aliases of `tied` ({alias: name}, the model's own
    ties) left out, and so any other name of the same memory (state.pt keeps ties shared);
    a tensor that only overlaps another's memory is copied. Returns it and {alias: name}."""
    out: dict[str, torch.Tensor] = {}
    aliases = {alias: name for alias, name in tied.items() if alias in state and name in state}
    views: dict[tuple[int, int, tuple[int, ...], tuple[int, ...], torch.dtype], str] = {}
    storages: set[int] = set()
    for name, tensor in state.items():
        if name in aliases:
            continue
        pointer = tensor.untyped_storage().data_ptr()
        view = (
            pointer,
            int(tensor.storage_offset()),
            tuple(tensor.shape),
            tensor.stride(),
            tensor.dtype,
        )
        if pointer and view in views:
            aliases[name] = views[view]
            continue
        if pointer and pointer in storages:
            tensor = tensor.clone()
        views[view] = name
        storages.add(pointer)
        out[name] = tensor.contiguous()
    return out, aliases


def save_safetensors(
    state: dict[str, torch.Tensor], tied: dict[str, str], metadata: dict[str, str]
) -> Callable[[Path], None]:
    """The writer of one safetensors file of `state` (see the module docstring)."""
    from safetensors.torch import save_file

    tensors, aliases = written_once(state, tied)
    if aliases:
        metadata = {**metadata, "shoal.tied": json.dumps(aliases, sort_keys=True)}

    def write(path: Path) -> None:
        save_file(tensors, str(path), metadata={"format": "pt", **metadata})
        fsync_file(path)

    return write


def save_hf_folder(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    tied: dict[str, str],
    provenance: dict[str, str],
) -> Callable[[Path], None]:
    """The writer of a folder that `from_pretrained` loads: `model` (a `PreTrainedModel` on
    the meta device) saves its config and `state` (in its own names); a tied weight is one
    tensor under all its names, so that `save_pretrained` keeps the name it reloads."""
    shared = dict(state)
    for alias, name in tied.items():
        if name in shared:
            shared[alias] = shared[name]

    def write(path: Path) -> None:
        from transformers.utils import logging as hf_logging

        bar = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            pretrained: Any = model  # a transformers PreTrainedModel
            pretrained.save_pretrained(path, state_dict=shared)
        finally:
            if bar:
                hf_logging.enable_progress_bar()
        (path / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")
        for file in path.iterdir():
            fsync_file(file)
        fsync_dir(path)

    return write


def refuse_existing(out: Path) -> None:
    if out.exists() or out.is_symlink():
        raise ShoalError(
            f"--out {out}: exists already; give a new path (an export never overwrites)"
        )


def place(out: Path, write: Callable[[Path], None], what: str) -> None:
    """Write `out` (a file or a folder) with `write`, into a temporary path beside it, then
    rename it into place; never over an existing `out`."""
    refuse_existing(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove(tmp)
        write(tmp)
        if out.exists():  # made meanwhile by someone else
            raise ShoalError(f"--out {out}: appeared while the export was written; give a new path")
        tmp.rename(out)
        fsync_dir(out.parent)
    except ShoalError:
        _remove(tmp)
        raise
    except Exception as exc:
        full = disk_full(exc, tmp, what)  # before the cleanup frees the space again
        _remove(tmp)
        if full is not None:
            raise ShoalError(f"{full}; free some space or give --out on another disk") from None
        denied = next((e for e in exception_chain(exc) if isinstance(e, OSError)), None)
        if denied is not None and denied.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise ShoalError(
                f"--out {out}: cannot write there ({denied.strerror}); give a folder you may "
                "write to"
            ) from None
        raise


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
