"""Write, list, prune and find checkpoints.

A checkpoint is a folder `checkpoints/step-<n>/` holding `state.pt` (the
state of every part the job hands over, under the part's name: model, optimizer,
schedule, data position, strategy state, every rank's RNG state; `parts.py`),
the files of its file parts (a parameter server's shards), and `meta.json`: what it is,
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from shoal.checkpoint.atomic import fsync_dir, fsync_file
from shoal.checkpoint.attempt import promote_config
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
from shoal.checkpoint.parts import FilePart, StatePart, collect
from shoal.checkpoint.space import DiskFull, disk_full
from shoal.config import dump_config
from shoal.errors import ShoalError
from shoal.runtime.collectives import all_reduce_max, barrier
from shoal.runtime.context import WorkerContext

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

    def __init__(
        self,
        ctx: WorkerContext,
        keep_last: int,
        directory: Path | None = None,
        what: str = "checkpoint",
        agree_on_full: bool = False,
    ) -> None:
        """`what`: what a save is called in messages; `agree_on_full`: a save that fails on
        a full disk raises DiskFull on every rank (agreed by one small all-reduce), so that
        the caller can skip it and go on (the in-memory snapshots); otherwise it raises
        DiskFull on the rank that failed, which ends the job."""
        self.ctx = ctx
        self.directory = directory or ctx.paths.checkpoints
        self.keep_last = keep_last
        self.what = what
        self.agree_on_full = agree_on_full

    def save(
        self,
        step: int,
        parts: Mapping[str, StatePart],
        meta: dict[str, Any],
        files: Sequence[FilePart] = (),
    ) -> Path | None:
        """Collective: every rank calls it. Returns the complete checkpoint folder on rank 0.

        Every part's `state_dict()` is taken on every rank (a part may gather what each
        rank holds: `parts.py`) and rank 0 saves them under their names in state.pt.
        Each file part then writes its files into the folder before it is renamed into
        place, returning {name: sha256} of what it wrote. Every file in the folder is
        hashed into meta.json, whoever wrote it; a declared checksum that differs from
        the bytes on disk fails the save. A collective file part (sharded state, DCP)
        writes on every rank into the temporary folder, before rank 0 seals and renames
        it. A save of a step that exists replaces it (a run resumed from an earlier
        checkpoint overtakes a later one).
        """
        state = collect(parts, self.ctx.is_main)
        tmp = self.directory / f".step-{step:08d}.tmp"
        what = f"{self.what} of step {step}"
        collective = [part for part in files if getattr(part, "collective", False)]
        full: DiskFull | None = None
        if self.ctx.is_main:
            try:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)  # also creates the directory (e.g. best/) on first use
            except OSError as exc:
                full = self._full(exc, tmp, what)
        if collective:  # every rank writes its pieces into the folder rank 0 prepared
            self._agree(full, what)
            barrier(self.ctx)
            try:
                for part in collective:
                    part.write_files(tmp)
            except Exception as exc:
                found = disk_full(exc, tmp, what)  # checked before the folder is removed
                if self.ctx.is_main:
                    shutil.rmtree(tmp, ignore_errors=True)
                full = self._full(found or exc, tmp, what)
            except BaseException:
                if self.ctx.is_main:
                    shutil.rmtree(tmp, ignore_errors=True)
                raise
        own = [part for part in files if part not in collective]
        path = None
        if self.ctx.is_main and full is None:
            try:
                path = self._write(step, tmp, state, meta, own)
            except DiskFull as exc:
                full = self._full(exc, tmp, what)
        self._agree(full, what)
        for part in files:
            part.written()
        return path

    def _full(self, exc: BaseException, tmp: Path, what: str) -> DiskFull:
        """`exc` as DiskFull when a full disk caused it (re-raised as it is otherwise); a
        manager that does not agree on full disks raises it at once."""
        full = exc if isinstance(exc, DiskFull) else disk_full(exc, tmp, what)
        if full is None:
            raise exc
        if not self.agree_on_full:
            raise full from None
        return full

    def _agree(self, full: DiskFull | None, what: str) -> None:
        """Collective for a manager that agrees on full disks: raises DiskFull on every
        rank when any rank's write failed on one (before any part's `written()`, which
        may meet the other ranks); returns otherwise."""
        if not self.agree_on_full:
            return
        (failed,) = all_reduce_max(self.ctx, [1.0 if full is not None else 0.0])
        if failed:
            raise full or DiskFull(f"{what} not written: another rank's disk is full")

    def _write(
        self,
        step: int,
        tmp: Path,
        state: dict[str, Any],
        meta: dict[str, Any],
        files: Sequence[FilePart],
    ) -> Path:
        final = self.directory / f"step-{step:08d}"
        try:
            # through a Python file: a full disk is then this error's context (ENOSPC), where
            # torch's own writer says only "unexpected pos ..."
            with open(tmp / STATE_FILE, "wb") as handle:
                torch.save(state, handle)
            fsync_file(tmp / STATE_FILE)
            declared: dict[str, str] = {}
            for part in files:
                declared.update(part.write_files(tmp))
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
        except Exception as exc:
            full = disk_full(exc, tmp, f"{self.what} of step {step}")  # before the cleanup
            shutil.rmtree(tmp, ignore_errors=True)
            if full is not None:
                raise full from exc
            raise
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
        """Remove checkpoints beyond `keep_last`. Each is renamed out of the `step-*` names
        first (one atomic rename), then deleted: a process killed in the middle of deleting
        one leaves a `.step-*.tmp` folder, which the next save removes, and never a `step-*`
        folder without its meta.json, which resume would rightly refuse as damaged."""
        for old in list_checkpoints(self.directory)[: -self.keep_last]:
            doomed = old.with_name(f".{old.name}.pruned.tmp")
            shutil.rmtree(doomed, ignore_errors=True)
            old.rename(doomed)
            shutil.rmtree(doomed, ignore_errors=True)
        for stale in self.directory.glob(".step-*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
