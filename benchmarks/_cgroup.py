"""Memory cgroups for jobs measured under a limit (cgroup v1 under /sys/fs/cgroup/memory, as
root): make one, start processes in it, read its peak and OOM kills, remove it.

Imported as a sibling module (`python benchmarks/<name>.py` puts this folder first on
sys.path) by the benchmarks that run a job under a limit, and by `tests/cgroup_ranks.py`
(as the tests import other benchmark helpers), so that making a group, joining it and
cleaning it up are written once.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup/memory")


def unavailable() -> str | None:
    """Why memory cgroups cannot be made here (None: they can)."""
    if not (CGROUP / "memory.limit_in_bytes").exists():
        return f"no cgroup v1 memory controller at {CGROUP}"
    if not os.access(CGROUP, os.W_OK):
        return f"{CGROUP} is not writable (needs root)"
    return None


def create(label: str, limit_bytes: int | None) -> Path:
    """A fresh memory cgroup named after `label`, limited to `limit_bytes` (None: no limit)."""
    group = CGROUP / f"shoal-{label}-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    if limit_bytes is not None:
        try:
            (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
        except OSError:
            group.rmdir()
            raise
    return group


def joiner(group: Path) -> Callable[[], None]:
    """A `preexec_fn` that moves the child into `group` before it runs anything, so every
    process it starts is counted there too."""

    def join() -> None:
        (group / "cgroup.procs").write_text(str(os.getpid()))

    return join


@dataclass(frozen=True)
class Usage:
    """What a group's processes took: the peak of its memory (page cache included), how
    often the limit was hit, and how many processes the kernel killed (None: this kernel
    does not count them)."""

    peak_bytes: int
    failcnt: int
    oom_kills: int | None


def usage(group: Path) -> Usage:
    """The group's figures so far."""
    oom = (group / "memory.oom_control").read_text()
    return Usage(
        peak_bytes=int((group / "memory.max_usage_in_bytes").read_text()),
        failcnt=int((group / "memory.failcnt").read_text()),
        oom_kills=int(oom.split("oom_kill ")[1].split()[0]) if "oom_kill " in oom else None,
    )


def remove(group: Path) -> None:
    """Kill what is left in `group` (a stopped run leaves none of its processes behind),
    then remove it: it empties once its last process is reaped, so the removal is tried
    for up to 5 s; a group still busy after that is left."""
    with suppress(FileNotFoundError):
        for pid in (group / "cgroup.procs").read_text().split():
            with suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    for _ in range(50):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


@contextmanager
def memory_cgroup(label: str, limit_bytes: int | None) -> Iterator[Path]:
    """A fresh group (see `create`), removed with whatever is left in it on the way out."""
    group = create(label, limit_bytes)
    try:
        yield group
    finally:
        remove(group)
