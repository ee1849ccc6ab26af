"""The checkpoint an export reads, and its model read whole.

The default is the best checkpoint (`best/step-*`: the model selection kept), else the one
named: `latest` (the newest of `checkpoints/`), `step-N` (in `checkpoints/` or `best/`), or a
checkpoint folder. Every file of it is verified against its sealed meta.json before a byte
is used, as a resume does (`checkpoint/integrity.py`); a sharded run's model is read from
its DCP pieces by this process alone, without the optimizer's (`checkpoint/sharded.py`).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from shoal.checkpoint.integrity import (
    CorruptCheckpoint,
    checkpoint_config_text,
    load_checkpoint,
)
from shoal.checkpoint.manager import list_checkpoints
from shoal.checkpoint.sharded import plain_model_state
from shoal.errors import ShoalError
from shoal.run import RunPaths

_STEP = re.compile(r"step-(\d+)")
HOW = "name one with --checkpoint (latest, step-N, or a checkpoint folder)"


@dataclass
class SavedModel:
    """A checkpoint's model, whole, with what the export says about it."""

    checkpoint: Path
    step: int
    config: dict[str, Any]  # the resolved config the checkpoint was trained with
    state: dict[str, torch.Tensor]  # every parameter and buffer, whole, by name


def pick_checkpoint(run_dir: Path, name: str | None) -> Path:
    """The checkpoint folder `--checkpoint name` means in run `run_dir` (None: the best)."""
    if not run_dir.is_dir():
        raise ShoalError(f"{run_dir}: no such run directory; give the folder `shoal train` made")
    paths = RunPaths(run_dir)
    if name is None:
        found = list_checkpoints(paths.best)
        if not found:
            raise ShoalError(
                f"{run_dir}: no best checkpoint ({paths.best}/step-*/; it is kept when a "
                f"validation improves); {HOW}{_have(paths)}"
            )
        return found[-1]
    if name == "latest":
        found = list_checkpoints(paths.checkpoints)
        if not found:
            raise ShoalError(
                f"--checkpoint latest: {paths.checkpoints} holds no checkpoint{_have(paths)}"
            )
        return found[-1]
    step = _STEP.fullmatch(name)
    if step is not None:
        folder = f"step-{int(step.group(1)):08d}"
        for directory in (paths.checkpoints, paths.best):
            if (directory / folder).is_dir():
                return directory / folder
        raise ShoalError(f"--checkpoint {name}: no such checkpoint in {run_dir}{_have(paths)}")
    path = Path(name)
    if path.is_dir():
        return path
    raise ShoalError(
        f"--checkpoint {name}: neither latest, step-N nor a checkpoint folder{_have(paths)}"
    )


def _have(paths: RunPaths) -> str:
    names = [f"checkpoints/{p.name}" for p in list_checkpoints(paths.checkpoints)]
    names += [f"best/{p.name}" for p in list_checkpoints(paths.best)]
    return f" (the run has: {', '.join(names)})" if names else " (the run has no checkpoint)"


def read_model(checkpoint: Path) -> SavedModel:
    """Checkpoint `checkpoint`'s model, whole, after every file of it was verified."""
    try:
        state, meta = load_checkpoint(checkpoint)
        config = tomllib.loads(checkpoint_config_text(checkpoint, meta))
        saved = state.get("model") if isinstance(state, dict) else None
        if not saved:
            strategy = config.get("strategy", {}).get("type")
            raise ShoalError(
                f"{checkpoint}: holds no model (a {strategy} run keeps its tables in its "
                "servers' shard files); shoal export writes models a checkpoint holds whole "
                "or in DCP pieces"
            )
        model = plain_model_state(checkpoint, saved)  # DCP's pieces were verified above
    except CorruptCheckpoint as exc:
        raise ShoalError(f"{exc.path}: checkpoint is corrupt ({exc.detail}); {HOW}") from None
    for name, value in model.items():
        if not isinstance(value, torch.Tensor):
            raise ShoalError(
                f"{checkpoint}: the model's entry {name} is a {type(value).__name__}, not a "
                "tensor; safetensors holds tensors only"
            )
    return SavedModel(checkpoint, int(meta.get("step", 0)), config, model)
