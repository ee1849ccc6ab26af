"""A failed worker's error report, read by the launcher to name who failed and why.

Written as JSON next to the worker's log; a worker of shoal's own launcher also
sends it, sealed, through the job's store (`runtime/heartbeat.py`), which needs no
disk: a full disk does not silence the report. Only plain text crosses, never pickle.
"""

from __future__ import annotations

import contextlib
import errno
import json
import re
import shutil
import traceback
from pathlib import Path
from typing import Any

from shoal.checkpoint.atomic import atomic_write_json
from shoal.checkpoint.space import DiskFull
from shoal.errors import EXIT_FAILURE, PeerFailed, ShoalError

#: less free space than this on the run's disk: a failed write is blamed on a full disk
FULL_BYTES = 1 << 20
_COMM_HINTS = ("gloo", "nccl", "connection closed", "connection reset", "timed out", "timeout")


def is_communication_error(exc: BaseException) -> bool:
    """A failure caused by a peer (it died, or a collective timed out), not by this rank,
    also when wrapped: torch's pipeline stages re-raise a lost peer's error as their own
    ("[Stage 0] failed to run forward"), with the peer's as its cause."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if _is_communication_error(current):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _is_communication_error(exc: BaseException) -> bool:
    if isinstance(exc, PeerFailed):
        return True
    try:
        import torch.distributed as dist

        if isinstance(exc, dist.DistError):
            return True
    except (ImportError, AttributeError):
        pass
    text = f"{type(exc).__name__}: {exc}".lower()
    return any(hint in text for hint in _COMM_HINTS)


def _first_line(exc: BaseException) -> str:
    """The message's first line, without a C++ source location such as `[.../pair.cc:534] `."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return re.sub(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", line)


def disk_note(folder: Path) -> str:
    """' (the disk holding FOLDER is full: N bytes free)' when it is, else ''.

    A write that fails on a full disk does not always say so (torch.save reports
    'unexpected pos ...'), so a failure message checks the run's disk itself."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return ""
    return f" (the disk holding {folder} is full: {free} bytes free)" if free < FULL_BYTES else ""


def build_report(
    rank: int, step: int, exc: BaseException, folder: Path | None = None
) -> dict[str, Any]:
    """What a failed rank says about its failure (plain data: JSON in a file or the store);
    `folder`: where the run writes, checked for a full disk."""
    user_error = isinstance(exc, ShoalError)
    message = _first_line(exc)
    full = isinstance(exc, DiskFull) or (isinstance(exc, OSError) and exc.errno == errno.ENOSPC)
    if folder is not None and not user_error and not full:
        message += disk_note(folder)
    return {
        "rank": rank,
        "step": step,
        "type": type(exc).__name__,
        "message": message,
        "lines": exc.lines if isinstance(exc, ShoalError) else [],
        "user_error": user_error,
        "exit_code": exc.exit_code if isinstance(exc, ShoalError) else EXIT_FAILURE,
        "communication_error": not user_error and is_communication_error(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }


def write_report(path: Path, rank: int, step: int, exc: BaseException) -> dict[str, Any]:
    """Write the report next to the rank's log (if the disk takes it); returns it."""
    report = build_report(rank, step, exc, path.parent)
    with contextlib.suppress(OSError):  # the log and the store may still have it
        atomic_write_json(path, report)
    return report


def read_report(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
