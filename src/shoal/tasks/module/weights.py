"""Pretrained weights in: a Hugging Face safetensors folder, or one safetensors file, read
into any layout, each rank reading only its pieces.

`[task] weights` names a folder (`model.safetensors`, or the shards a
`model.safetensors.index.json` lists, as `save_pretrained` writes them) or one
`.safetensors` file. safetensors files are memory-mapped and sliced on read
(`safe_open(...).get_slice`), so a rank of a tensor-parallel or fully sharded layout reads
the rows and columns of its own shard and never a whole tensor; a model held in another
layout than the file's (GPT-2's fused attention, held as three projections:
`families.py`) reads the file's tensor whole, one at a time, and takes its part.

Names are the model's own (`state_dict`); a file saved from the base model (without the
head's prefix, e.g. `layers.0...` for a `LlamaForCausalLM`'s `model.layers.0...`) is
matched through the model's `base_model_prefix`. What the file lacks is initialised as
without weights (a new classification head), what it has beyond the model is left out,
and both are logged; a file that matches none of the model's names is one line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from shoal.errors import ShoalError

INDEX = "model.safetensors.index.json"


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a weights folder or file (raises ValueError: what is wrong)."""
    if path.is_file():
        if path.suffix != ".safetensors":
            raise ValueError(f"{path} is not a .safetensors file")
        return [path]
    if not path.is_dir():
        raise ValueError(f"not found: {path}")
    index = path / INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ValueError(f"{index}: not a safetensors index (no weight_map)") from None
        missing = [name for name in shards if not (path / name).is_file()]
        if missing:
            raise ValueError(f"{index} lists {missing[0]}, which is not in {path}")
        return [path / name for name in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} holds no .safetensors file (save_pretrained writes one)")
    return files


class Pretrained:
    """The tensors of a weights folder or file, by the model's names, read piece by piece."""

    def __init__(self, path: str, model: nn.Module) -> None:
        from safetensors import safe_open

        self.path = path
        files = weight_files(Path(path))
        self._handles = [safe_open(str(f), framework="pt") for f in files]
        where = {key: h for h in self._handles for key in h.keys()}  # noqa: SIM118
        names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
        names += [n for n, _ in model.named_buffers()]
        #: model name -> (file key, how the model's tensor is made from the file's)
        self.keys: dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor] | None]] = {}
        from shoal.tasks.module.families import FusedQKV

        fused = any(isinstance(m, FusedQKV) for m in model.modules())  # GPT-2, held unfused
        for name in names:
            found = _file_key(name, where, model, fused)
            if found is not None:
                self.keys[name] = found
        self._where = where
        if not any(n in self.keys for n, _ in model.named_parameters()):
            sample = ", ".join(sorted(where)[:3])
            raise ShoalError(
                f"task.weights: {path} has none of the model's parameters (it has {sample}, "
                f"...; the model has {names[0]}, ...): weights saved from another model?"
            )
        used = {key for key, _ in self.keys.values()}
        self.unexpected = sorted(set(where) - used)

    def has(self, name: str) -> bool:
        return name in self.keys

    def missing(self, model: nn.Module) -> list[str]:
        return [n for n, _ in model.named_parameters() if n not in self.keys]

    def full(self, name: str) -> torch.Tensor:
        """The model's tensor `name`, whole, on the CPU."""
        key, convert = self.keys[name]
        tensor = self._where[key].get_tensor(key)
        return convert(tensor) if convert is not None else tensor

    def read_into(self, name: str, target: torch.Tensor) -> None:
        """`target`'s piece of tensor `name` (a DTensor: its local shard, read as a slice)."""
        key, convert = self.keys[name]
        with torch.no_grad():
            if convert is None and isinstance(target, DTensor):
                from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

                shape, offset = compute_local_shape_and_global_offset(
                    target.shape, target.device_mesh, target.placements
                )
                part = self._where[key].get_slice(key)
                if tuple(part.get_shape()) != tuple(target.shape):
                    raise self._shape_error(name, key, part.get_shape(), target.shape)
                index = tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))
                local = target.to_local()
                local.copy_(part[index] if index else part[:])
                return
            value = self.full(name)
            if tuple(value.shape) != tuple(target.shape):
                raise self._shape_error(name, key, value.shape, target.shape)
            if isinstance(target, DTensor):
                from shoal.training.materialise import copy_piece

                copy_piece(target, value)
            else:
                target.copy_(value)

    def _shape_error(self, name: str, key: str, got: Any, want: Any) -> ShoalError:
        return ShoalError(
            f"task.weights: {self.path}: {key} has shape {tuple(got)}, the model's {name} "
            f"{tuple(want)}: weights of another configuration of the model?"
        )


def _file_key(
    name: str, where: dict[str, Any], model: nn.Module, fused: bool
) -> tuple[str, Callable[[torch.Tensor], torch.Tensor] | None] | None:
    """The file's key for the model's tensor `name`, and its conversion (None: as it is;
    `fused`: a GPT-2 held unfused, whose file has Hugging Face's layout)."""
    prefix = getattr(model, "base_model_prefix", "")
    candidates = [name]
    if prefix and name.startswith(prefix + "."):
        candidates.append(name[len(prefix) + 1 :])  # saved from the base model
    elif prefix:
        candidates.append(f"{prefix}.{name}")  # a base model loading a full model's file
    from shoal.tasks.module.families import hf_source

    for candidate in candidates:
        found = hf_source(candidate) if fused else None
        if found is not None and found[0] in where:
            return found
        if found is None and candidate in where:
            return candidate, None
    return None
