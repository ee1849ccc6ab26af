"""A checkpoint or snapshot that failed because its disk is full, said as such.

A write into a full disk does not always say so: torch.save reports
`unexpected pos 576 vs 534` (the ENOSPC is only its context, and only when it
writes through a Python file), DCP reports a `CheckpointException` naming ranks.
And the half-written folder is removed right after the failure, which frees the
space again, so whoever looks later finds a disk with room. So the writer checks
at once, before cleaning up: the error's own chain (ENOSPC, EDQUOT) and the free
space of the folder it was writing into.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

#: less free space than this where a write failed: the failure is blamed on a full disk
FULL_BYTES = 1 << 20
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(RuntimeError):
    """A checkpoint or snapshot was not written: the disk holding its folder is full."""


def free_bytes(folder: Path) -> int | None:
    """Free bytes on the disk holding `folder` (or its nearest existing parent)."""
    for candidate in (folder, *folder.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def disk_full(exc: BaseException, folder: Path, what: str) -> DiskFull | None:
    """`what` ("checkpoint of step 5") as a DiskFull when `exc`, raised while writing into
    `folder`, came from a full disk; None when it did not. Call it before cleaning up."""
    free = free_bytes(folder)
    said = any(isinstance(e, OSError) and e.errno in _FULL_ERRNOS for e in exception_chain(exc))
    if not said and (free is None or free >= FULL_BYTES):
        return None
    room = f"{free:,} bytes free" if free is not None else "no space left"
    return DiskFull(f"{what} not written: the disk holding {folder.parent} is full ({room})")


def exception_chain(exc: BaseException) -> list[BaseException]:
    """`exc` and its causes and contexts, each once."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not e for e in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen
