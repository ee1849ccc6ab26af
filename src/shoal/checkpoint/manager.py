"""Write, list, prune and read checkpoints.

A checkpoint is a folder `checkpoints/step-<n>/` holding `state.pt` (model,
optimizer, schedule, data position, strategy state, every rank's RNG state) and
`meta.json` (what it is, with the checksum of `state.pt`). It is assembled in a
hidden temporary folder and renamed into place, so a folder named `step-<n>` is
always complete; a crash while writing leaves only a temporary folder, which is
ignored and cleaned up, and the previous checkpoint stays the latest.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from shoal.checkpoint.atomic import fsync_dir, fsync_file
from shoal.errors import ShoalError
from shoal.runtime.collectives import gather_bytes
from shoal.runtime.context import WorkerContext
from shoal.runtime.rng import capture_rng

STATE_FILE = "state.pt"
META_FILE = "meta.json"
FORMAT_VERSION = 1


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def list_checkpoints(directory: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not directory.is_dir():
        return []
    found = [
        p
        for p in directory.iterdir()
        if p.is_dir() and p.name.startswith("step-") and (p / META_FILE).is_file()
    ]
    return sorted(found, key=lambda p: int(p.name.removeprefix("step-")))


def find_checkpoint(target: Path) -> Path:
    """The checkpoint to resume from: `target` itself, or the newest in run dir `target`."""
    if (target / META_FILE).is_file():
        return target
    found = list_checkpoints(target / "checkpoints")
    if not found:
        raise ShoalError(
            f"{target}: no checkpoint to resume from (expected {target}/checkpoints/step-*/)"
        )
    return found[-1]


class CheckpointManager:
    """Saves and loads checkpoints for one run; rank 0 writes, every rank contributes RNG state."""

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
        """Collective: every rank calls it. Returns the checkpoint folder on rank 0.

        `extra_files(folder)` (rank 0) may write more files into the folder before it is
        renamed into place, returning {name: sha256}; they are verified on loading too.
        """
        rng = gather_bytes(self.ctx, capture_rng())
        if not self.ctx.is_main:
            return None
        final = self.directory / f"step-{step:08d}"
        if final.exists():
            return final  # this step is already saved (e.g. an epoch ended on a step boundary)
        tmp = self.directory / f".step-{step:08d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)  # also creates the directory itself (e.g. best/) on first use
        payload = dict(state)
        payload["rng"] = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in rng]
        torch.save(payload, tmp / STATE_FILE)
        fsync_file(tmp / STATE_FILE)
        checksums = {STATE_FILE: _sha256(tmp / STATE_FILE)}
        if extra_files is not None:
            checksums.update(extra_files(tmp))
        info = {
            "format": FORMAT_VERSION,
            "step": step,
            "world_size": self.ctx.world_size,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "sha256": checksums,
            **meta,
        }
        (tmp / META_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        fsync_file(tmp / META_FILE)
        fsync_dir(tmp)
        tmp.rename(final)
        fsync_dir(self.directory)
        self._prune()
        return final

    def _prune(self) -> None:
        for old in list_checkpoints(self.directory)[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.directory.glob(".step-*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)


def load_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read and verify a checkpoint; returns (state, meta). Safe: weights_only loading."""
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise ShoalError(f"{path}: unreadable checkpoint metadata: {exc}") from None
    for name, expected in meta.get("sha256", {}).items():
        if not (path / name).is_file() or _sha256(path / name) != expected:
            raise ShoalError(
                f"{path}: checkpoint is corrupt ({name} is missing or does not match its "
                "checksum); resume from an earlier one by passing its folder to --resume"
            )
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    return state, meta
