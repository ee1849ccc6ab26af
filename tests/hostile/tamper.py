"""Helpers for red-team tests: snapshots of a run directory, edits of a checkpoint's meta."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.checkpoint.integrity import META_FILE, seal


def snapshot(run: Path) -> dict[str, bytes | None]:
    """The bytes of everything a failed resume must leave alone: config.toml, results.json,
    and every file under checkpoints/ and best/."""
    files: dict[str, bytes | None] = {}
    for name in ("config.toml", "results.json"):
        path = run / name
        files[name] = path.read_bytes() if path.exists() else None
    for folder in ("checkpoints", "best"):
        for path in sorted((run / folder).rglob("*")):
            if path.is_file():
                files[str(path.relative_to(run))] = path.read_bytes()
    return files


def edit_meta(
    folder: Path, change: Callable[[dict[str, Any]], None], *, reseal: bool = True
) -> None:
    """Change a checkpoint's meta.json as a careful forger would (resealing it) or not."""
    meta = json.loads((folder / META_FILE).read_text())
    change(meta)
    if reseal:
        meta.pop("meta_sha256", None)
        meta = seal(meta)
    (folder / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))


def flip_bytes(path: Path, count: int = 16) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for i in range(middle, middle + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
