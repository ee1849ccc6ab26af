"""A job's worker processes seen from outside: the process tree, and each worker's rank.

A worker forked by the launcher's forkserver (`start.py`) is the launcher's grandchild,
and its /proc/PID/environ is the forkserver's (Linux shows a process's environment as
it was at exec). So its rank is written into its title instead, as `[rank N]` at the
end of its command line; an exec'd worker (or one under torchrun) has `RANK` in its
environment. Tests, benchmarks and tools that signal one rank find it here.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

_RANK_IN_TITLE = re.compile(rb"\[rank (\d+)\]")


def rank_title(rank: int | str | None) -> str:
    """The end of a forked worker's title that `rank_of` reads back."""
    return f"[rank {rank}]"


def children(pid: int) -> list[int]:
    """The direct children of `pid` (none once it has ended)."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def descendants(pid: int) -> list[int]:
    """Children, grandchildren, ...: forked workers are the launcher's grandchildren."""
    found = children(pid)
    return found + [p for child in found for p in descendants(child)]


def environ(pid: int) -> dict[str, str]:
    """The environment `pid` was exec'd with ({} once it has ended)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


def rank_of(pid: int) -> int:
    """A worker's rank: from its environment (exec'd) or its title (forked); -1 for a
    process that is not a worker (or has ended)."""
    rank = environ(pid).get("RANK")
    if rank is None:
        with contextlib.suppress(OSError):
            found = _RANK_IN_TITLE.search(Path(f"/proc/{pid}/cmdline").read_bytes())
            rank = found.group(1).decode() if found else None
    return int(rank) if rank is not None and rank.isdigit() else -1
