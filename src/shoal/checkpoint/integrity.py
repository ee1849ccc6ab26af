"""What makes a folder a checkpoint: a sealed meta.json whose checksums cover every file.

`meta.json` names every other file of the folder with its sha256 and carries a
checksum of its own content (`meta_sha256`), so no byte of a checkpoint is
trusted unverified. A checkpoint is refused, with one message whatever the
cause, when its meta is unreadable or unsealed, lacks the checksums, lacks an
entry for a file present, names a file that is missing, or a file does not
match: loading "whatever bytes are there" once trained on a corrupted Adam state
without a word. Checkpoints of format 1 (before the seal) are read if their
checksums cover every file.

Loading is `torch.load(weights_only=True)`: tensors and plain containers only,
never arbitrary pickled objects.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from shoal.errors import ShoalError

STATE_FILE = "state.pt"
META_FILE = "meta.json"
FORMAT_VERSION = 2
SEAL_KEY = "meta_sha256"


class CorruptCheckpoint(ShoalError):
    """A checkpoint that is not complete and verifiable; the one message for every cause."""

    def __init__(self, path: Path, detail: str) -> None:
        self.path, self.detail = path, detail  # for a caller that says what to do otherwise
        super().__init__(
            f"{path}: checkpoint is corrupt ({detail}); resume from an earlier one by passing "
            "its folder to --resume"
        )


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _seal_of(meta: dict[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != SEAL_KEY}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def seal(meta: dict[str, Any]) -> dict[str, Any]:
    """`meta` with the checksum of its own content added."""
    return {**meta, SEAL_KEY: _seal_of(meta)}


def folder_files(path: Path) -> list[str]:
    """Every file under a checkpoint folder but meta.json, as paths relative to it."""
    return sorted(
        p.relative_to(path).as_posix()
        for p in path.rglob("*")
        if not p.is_dir() and p.relative_to(path).as_posix() != META_FILE
    )


def read_meta(path: Path) -> dict[str, Any]:
    """meta.json of checkpoint `path`, checked without reading the other files' bytes:
    sealed, with a checksum for exactly the files present. Raises CorruptCheckpoint."""
    try:
        meta = json.loads((path / META_FILE).read_text())
    except FileNotFoundError:
        raise CorruptCheckpoint(path, f"{META_FILE} is missing") from None
    except (OSError, ValueError) as exc:
        raise CorruptCheckpoint(path, f"{META_FILE} is unreadable: {exc}") from None
    if not isinstance(meta, dict):
        raise CorruptCheckpoint(path, f"{META_FILE} is not a JSON object")
    fmt = meta.get("format")
    if not isinstance(fmt, int) or fmt > FORMAT_VERSION:
        raise CorruptCheckpoint(path, f"{META_FILE} has an unknown format {fmt!r}")
    if fmt >= 2 and meta.get(SEAL_KEY) != _seal_of(meta):
        what = "does not match its own checksum" if SEAL_KEY in meta else "is not sealed"
        raise CorruptCheckpoint(path, f"{META_FILE} {what}")
    checksums = meta.get("sha256")
    if not isinstance(checksums, dict) or not checksums:
        raise CorruptCheckpoint(path, f"{META_FILE} has no checksums")
    present = folder_files(path)
    if STATE_FILE not in present:
        raise CorruptCheckpoint(path, f"{STATE_FILE} is missing")
    for name in present:
        if not isinstance(checksums.get(name), str):
            raise CorruptCheckpoint(path, f"{name} is not covered by {META_FILE}'s checksums")
    for name in sorted(set(checksums) - set(present)):
        raise CorruptCheckpoint(path, f"{name} is missing")
    return meta


def verify_files(path: Path, meta: dict[str, Any], names: Iterable[str] | None = None) -> None:
    """Compare the bytes of `names` (default: every file) with meta's checksums."""
    checksums: dict[str, str] = meta["sha256"]
    for name in sorted(checksums) if names is None else names:
        expected = checksums.get(name)
        if expected is None:
            raise CorruptCheckpoint(path, f"{name} is not covered by {META_FILE}'s checksums")
        try:
            actual = sha256_file(path / name)
        except FileNotFoundError:
            raise CorruptCheckpoint(path, f"{name} is missing") from None
        if actual != expected:
            raise CorruptCheckpoint(path, f"{name} does not match its checksum")


def verified_meta(path: Path, names: Iterable[str] | None = None) -> dict[str, Any]:
    """read_meta, then verify_files: the meta of a checkpoint whose files were all checked."""
    meta = read_meta(path)
    verify_files(path, meta, names)
    return meta


def load_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Verify every file of a checkpoint, then read its state; returns (state, meta)."""
    meta = verified_meta(path)
    return load_tensors(path, STATE_FILE), meta


def load_tensors(path: Path, name: str, mmap: bool = False) -> Any:
    """torch.load of checkpoint file `name` with weights_only: nothing but tensors and plain
    data is unpickled, whatever the file holds. `mmap`: tensors map the file rather than
    being read into memory (a file larger than memory)."""
    try:
        return torch.load(path / name, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        raise CorruptCheckpoint(
            path, f"{name} holds objects other than tensors and plain data; it is not loaded"
        ) from None


def checkpoint_config_text(path: Path, meta: dict[str, Any]) -> str:
    """The resolved config (TOML) the checkpoint was written with."""
    text = meta.get("config")
    if isinstance(text, str):
        return text
    # format 1 kept it in state.pt only
    verify_files(path, meta, [STATE_FILE])
    state = load_tensors(path, STATE_FILE)
    saved = state.get("config") if isinstance(state, dict) else None
    if not isinstance(saved, str):
        raise CorruptCheckpoint(path, f"{STATE_FILE} holds no config")
    return saved
