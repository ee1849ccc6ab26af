"""What the launcher learns about its workers: authenticated store values and process states.

The store is reachable by any local process, so every value read from it is
opened with the job's secret (`runtime/auth.py`) and validated; a bad one is
ignored and reported once per key, naming the key and why. A worker's
heartbeat is then trusted only as far as it is authentic: nobody can keep a
frozen worker alive by writing fresh-looking values, nor replay an old one.

Besides heartbeats, the launcher reads `/proc/<pid>/stat` of its own workers: a
process in state `T` (stopped by SIGSTOP, Ctrl-Z or a debugger) is named within
a second or two, without waiting for its heartbeat to time out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from shoal.runtime.auth import BadValue, Opener, Signer
from shoal.runtime.heartbeat import (
    Beat,
    heartbeat_key,
    parse_beat_detail,
    parse_report,
    report_key,
)

#: process states of a stopped process (SIGSTOP / job control, or a tracing stop)
STOPPED_STATES = ("T", "t")


def process_state(pid: int) -> str | None:
    """The one-letter state of process `pid` from /proc (None if unknown: gone, or not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # "pid (command) state ...": the command may hold spaces and parentheses
    fields = stat.rpartition(b")")[2].split()
    return fields[0].decode("ascii", "replace") if fields else None


class StoreReader:
    """Authenticated, validated reads of the workers' heartbeats and reports."""

    def __init__(self, store: dist.Store, signer: Signer, notice: Callable[[str], None]) -> None:
        self.store = store
        self.opener = Opener(signer)
        self.notice = notice
        self.rejected: dict[str, str] = {}  # key -> why its last bad value was refused
        self._beats: dict[int, Beat] = {}

    def _read(self, key: str) -> bytes | None:
        try:
            return self.store.get(key) if self.store.check([key]) else None
        except Exception:  # the store is being torn down
            return None

    def _open(self, key: str, parse: Callable[[bytes], Any]) -> Any:
        value = self._read(key)
        if value is None:
            return None
        try:
            return parse(self.opener.open(key, value))
        except BadValue as exc:
            if key not in self.rejected:
                self.notice(
                    f"ignored a value under {key} in this job's store: {exc}; another process "
                    "on this machine is writing to the job's store"
                )
            self.rejected[key] = str(exc)
            return None

    def heartbeat(self, rank: int) -> Beat | None:
        """The rank's newest authentic heartbeat (wall time, step, state, role), or None
        before its first."""
        beat = self._open(heartbeat_key(self.opener.signer, rank), parse_beat_detail)
        if beat is not None:
            self._beats[rank] = beat
        return self._beats.get(rank)

    def steps(self, ranks: list[int]) -> dict[int, int]:
        """The newest step each rank reported."""
        steps = {}
        for rank in ranks:
            beat = self.heartbeat(rank)
            if beat is not None:
                steps[rank] = beat[1]
        return steps

    def report(self, rank: int) -> dict[str, Any] | None:
        """The rank's error report sent through the store (None if none, or not authentic)."""
        key = report_key(self.opener.signer, rank)
        report: dict[str, Any] | None = self._open(key, parse_report)
        return report

    def tampering(self, rank: int) -> str:
        """'; its heartbeat key also held values that failed authentication (...)', or ''."""
        why = self.rejected.get(heartbeat_key(self.opener.signer, rank))
        if why is None:
            return ""
        return f"; its heartbeat key also held values that failed authentication ({why})"


def existing(*paths: Path) -> Path | None:
    """The first of `paths` that exists."""
    for path in paths:
        with contextlib.suppress(OSError):
            if path.is_file():
                return path
    return None
