"""What a worker does to resume: read a verified checkpoint, check what changed, load the model.

Every strategy's restore goes through :func:`open_resume`, so every one refuses
the same changes (`changes.py`; `shoal train` already checked the config before
starting workers, but only a built task knows its training size) and records
the ones it makes. :meth:`Resume.check_model` turns the cut-off message of
`load_state_dict` into one line: the first parameters that do not fit, their
shapes, and the config fields that changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from shoal.checkpoint.changes import (
    INCOMPATIBLE,
    SAFE,
    Change,
    ResumeRules,
    refuse_changes,
    resume_changes,
)
from shoal.checkpoint.integrity import load_checkpoint
from shoal.checkpoint.sharded import is_marker
from shoal.errors import ShoalError
from shoal.monitor.metrics import MetricsLog
from shoal.runtime.context import WorkerContext


@dataclass
class Resume:
    path: Path
    state: dict[str, Any]
    meta: dict[str, Any]
    changes: list[Change] = field(default_factory=list)

    def check_model(self, model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
        """Raise one clear line if `saved` (a model state dict) does not fit `model`.

        An empty `saved` means the strategy keeps the model elsewhere (a parameter
        server's shard files, checked when they are read)."""
        if not saved or is_marker(saved):  # sharded: DCP checks the pieces by name and shape
            return
        own = model.state_dict()
        problems = [
            f"{name} is {_shape(saved[name])} in the checkpoint, {_shape(own[name])} in the model"
            for name in own
            if name in saved and tuple(saved[name].shape) != tuple(own[name].shape)
        ]
        problems += [f"{name} is missing from the checkpoint" for name in own if name not in saved]
        problems += [
            f"the checkpoint has {name}, the model does not" for name in saved if name not in own
        ]
        if not problems:
            return
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        task_changes = [c for c in self.changes if c.field.startswith("task.")]
        if task_changes:
            likely = "; ".join(f"{c.field}: {c.text()}" for c in task_changes[:2])
            hint = f"likely cause: {likely}"
        else:
            hint = (
                "the config's [task] is as the checkpoint holds it: did the data or the model "
                "factory behind it change?"
            )
        raise ShoalError(
            f"{self.path}: the checkpoint does not fit the model: {problems[0]}{more}; {hint}; "
            "resume with the model the checkpoint was trained with"
        )


def _shape(tensor: torch.Tensor) -> str:
    return "(" + ", ".join(map(str, tensor.shape)) + ")"


def open_resume(ctx: WorkerContext, path: Path, train_size: int, rules: ResumeRules) -> Resume:
    """Verify and read checkpoint `path`; refuse changes the resume may not make; log and
    record (rank 0, in metrics.jsonl) the ones it makes."""
    state, meta = load_checkpoint(path)
    changes = resume_changes(path, meta, ctx.config, rules, train_size)
    refuse_changes(changes, path, ctx.allow_changes)
    if changes and ctx.is_main:
        for change in changes:
            level = ctx.log.info if change.kind == SAFE else ctx.log.warning
            allowed = "" if change.kind == SAFE else " (allowed by --allow-changes)"
            level("resuming with a change of %s: %s%s", change.field, change.text(), allowed)
        metrics = MetricsLog(ctx.paths.metrics, enabled=True)
        metrics.write(
            {
                "event": "config_change",
                "step": meta.get("step"),
                "checkpoint": str(path),
                "changes": [c.record() for c in changes if c.kind != INCOMPATIBLE],
            }
        )
        metrics.close()
    return Resume(path, state, meta, changes)
