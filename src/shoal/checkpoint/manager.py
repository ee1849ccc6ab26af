"""Write, list, prune and find checkpoints.

A checkpoint is a folder `checkpoints/step-<n>/` holding `state.pt` (model,
optimizer, schedule, data position, strategy state, every rank's RNG state), any
files a strategy adds (a parameter server's shards), and `meta.json`: what it is,
the config and data it was trained with, and the checksum of every other file
(`integrity.py`). It is assembled in a hidden temporary folder and renamed into
place, so a folder named `step-<n>` is complete unless something outside shoal
changed it; a crash while writing leaves only a temporary folder, which is
ignored and cleaned up, and the previous checkpoint stays the latest. `save`
returns a folder only once it is complete: a failure while writing raises, and
the caller logs no checkpoint.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from shoal.checkpoint.atomic import fsync_dir, fsync_file
from shoal.checkpoint.fingerprint import data_fingerprint
from shoal.checkpoint.integrity import (
    FORMAT_VERSION,
    META_FILE,
    STATE_FILE,
    folder_files,
    load_checkpoint,
    seal,
    sha256_file,
)
from shoal.config import dump_config
from shoal.errors import ShoalError
from shoal.run.attempt import promote_config
from shoal.runtime.collectives import gather_bytes
from shoal.runtime.context import WorkerContext
from shoal.runtime.rng import capture_rng

__all__ = [
    "META_FILE",
    "STATE_FILE",
    "CheckpointManager",
    "find_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
]

_STEP = re.compile(r"step-(\d+)")


def list_checkpoints(directory: Path) -> list[Path]:
    """Complete checkpoints (folders `step-<n>` with a meta.json), oldest first."""
    if not directory.is_dir():
        return []
    found = [
        p
        for p in directory.iterdir()
        if _STEP.fullmatch(p.name) and p.is_dir() and (p / META_FILE).is_file()
    ]
    return sorted(found, key=lambda p: int(p.name.removeprefix("step-")))


def damaged_checkpoints(directory: Path) -> list[Path]:
    """Entries named `step-*` that are not complete checkpoints."""
    if not directory.is_dir():
        return []
    complete = set(list_checkpoints(directory))
    return sorted(p for p in directory.glob("step-*") if p not in complete)


def find_checkpoint(target: Path) -> Path:
    """The checkpoint to resume from: `target` itself, or the newest in run dir `target`.

    A `step-*` folder without meta.json is not a checkpoint, and shoal never leaves
    one (it renames complete folders into place): something else changed the run.
    Resuming is then refused rather than falling back silently to an older
    checkpoint: the fallback would train past the damaged folder's step and replace
    it, and what it held (its state.pt may be all the user needs to recover) would
    be gone before anyone looked. The message names the damaged folder and the
    newest complete checkpoint; the user moves the folder away (or passes a
    checkpoint to --resume explicitly) and resumes knowingly.
    """
    if (target / META_FILE).is_file():
        return target
    if _STEP.fullmatch(target.name) and target.is_dir():
        raise ShoalError(
            f"--resume {target}: not a checkpoint ({META_FILE} is missing); pass a run "
            "directory or a checkpoint folder that has one"
        )
    directory = target / "checkpoints"
    found = list_checkpoints(directory)
    damaged = damaged_checkpoints(directory)
    if damaged:
        newest = (
            f"the newest complete checkpoint is {found[-1]}"
            if found
            else "no complete checkpoint is left"
        )
        raise ShoalError(
            f"{damaged[-1]}: not a checkpoint (no {META_FILE}; shoal never leaves one half "
            f"written, so something else changed it); move it out of {directory} to keep it (a "
            f"resumed run would replace it), then resume: {newest}"
        )
    if not found:
        raise ShoalError(
            f"{target}: no checkpoint to resume from (expected {target}/checkpoints/step-*/)"
        )
    return found[-1]


class CheckpointManager:
    """Saves checkpoints for one run; rank 0 writes, every rank contributes RNG state."""

    def __init__(self, ctx: WorkerContext, keep_last: int, directory: Path | None = None) -> None:
        self.ctx = ctx
        self.directory = directory or ctx.paths.checkpoints
        self.keep_last = keep_last

    def save(
        self,
        step: int,
        state: dict[str, Any],
        meta: dict[str, Any],
        extra_files: Callable[[Path], dict[str, str]] | None = None,
    ) -> Path | None:
        """Collective: every rank calls it. Returns the complete checkpoint folder on rank 0.

        `extra_files(folder)` (rank 0) may write more files into the folder before it is
        renamed into place, returning {name: sha256} of what it wrote. Every file in the
        folder is then hashed into meta.json, whoever wrote it; a declared checksum that
        differs from the bytes on disk fails the save. A save of a step that exists
        replaces it (a run resumed from an earlier checkpoint overtakes a later one).
        """
        rng = gather_bytes(self.ctx, capture_rng())
        if not self.ctx.is_main:
            return None
        final = self.directory / f"step-{step:08d}"
        tmp = self.directory / f".step-{step:08d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)  # also creates the directory itself (e.g. best/) on first use
        try:
            payload = dict(state)
            payload["rng"] = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in rng]
            torch.save(payload, tmp / STATE_FILE)
            fsync_file(tmp / STATE_FILE)
            declared = extra_files(tmp) if extra_files is not None else {}
            checksums = {name: sha256_file(tmp / name) for name in folder_files(tmp)}
            for name, digest in declared.items():
                if checksums.get(name) != digest:
                    raise RuntimeError(
                        f"{tmp / name}: written with sha256 {digest} but reads back "
                        f"{checksums.get(name, 'as missing')}; the checkpoint is not kept"
                    )
            info = {
                "format": FORMAT_VERSION,
                "step": step,
                "world_size": self.ctx.world_size,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "strategy": self.ctx.config.strategy.type,
                "task": self.ctx.config.task.type,
                "config": dump_config(self.ctx.config),
                "data": data_fingerprint(self.ctx.config),
                **meta,
                "sha256": checksums,
            }
            (tmp / META_FILE).write_text(json.dumps(seal(info), indent=2, sort_keys=True) + "\n")
            fsync_file(tmp / META_FILE)
            fsync_dir(tmp)
            # from the first checkpoint a resumed run writes, config.toml describes it
            promote_config(self.ctx.paths, self.ctx.config)
            self._install(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune()
        return final

    def _install(self, tmp: Path, final: Path) -> None:
        if final.exists():
            old = final.with_name(f".{final.name}.old.tmp")  # pruned if a crash leaves it
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            tmp.rename(final)
            fsync_dir(self.directory)
            shutil.rmtree(old, ignore_errors=True)
            return
        tmp.rename(final)
        fsync_dir(self.directory)

    def _prune(self) -> None:
        for old in list_checkpoints(self.directory)[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.directory.glob(".step-*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
