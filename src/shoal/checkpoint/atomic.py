"""Durable writes: a reader sees the old file or the new one, never half of one.

Write to a temporary file in the same folder, fsync it, rename it over the
target, fsync the folder. A crash at any point leaves the previous version.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def fsync_dir(path: Path) -> None:
    """Make a rename or creation inside `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_stream(path: Path, write: Callable[[BinaryIO], None]) -> str:
    """`atomic_write_bytes` for what `write` writes to a file object, without holding it in
    memory (a shard larger than memory); returns the file's sha256, read back in blocks."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w+b") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
            handle.seek(0)
            digest = hashlib.sha256()
            while block := handle.read(1 << 22):
                digest.update(block)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return digest.hexdigest()


def atomic_write_json(path: Path, payload: Any) -> None:
    atomic_write_bytes(path, (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode())


def fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
