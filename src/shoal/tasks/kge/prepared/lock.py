"""One process at a time prepares (or verifies) a graph; the others wait for it, not forever.

An exclusive `flock` on a lock file beside the folder: the kernel releases it when
its holder exits, however it exits, so a crashed preparation never blocks the next.
The holder writes who it is into the file and touches it as it makes progress; a
waiter gives up, naming the holder, when the file has not been touched for
`stall_s` seconds (a preparation may take minutes; a stuck one is told apart from a
slow one by its silence, not by a total time).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from types import TracebackType

from shoal.errors import DataError

POLL_S = 0.1
BEAT_EVERY_S = 1.0


class FolderLock:
    """`with FolderLock(path, what, stall_s) as lock:` ... `lock.beat()` while working."""

    def __init__(self, path: Path, what: str, stall_s: float) -> None:
        self.path = path
        self.what = what
        self.stall_s = stall_s
        self._fd = -1
        self._last_beat = 0.0

    def __enter__(self) -> FolderLock:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._wait()
        except BaseException:
            os.close(self._fd)
            raise
        os.ftruncate(self._fd, 0)
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "what": self.what}
        os.pwrite(self._fd, json.dumps(holder).encode(), 0)
        self.beat(force=True)
        return self

    def _wait(self) -> None:
        started = time.monotonic()
        started_wall = time.time()
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            quiet = time.time() - max(os.fstat(self._fd).st_mtime, started_wall)
            if quiet > self.stall_s:
                raise DataError(
                    f"{self.what}: waited {time.monotonic() - started:.0f} s for {self._holder()}, "
                    f"which holds {self.path} and made no progress for {self.stall_s:g} s "
                    "(faults.timeout_s); stop that process or raise the timeout"
                )
            time.sleep(POLL_S)

    def _holder(self) -> str:
        try:
            holder = json.loads(os.pread(self._fd, 4096, 0))
            return f"process {holder['pid']} on {holder['host']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"

    def beat(self, force: bool = False) -> None:
        """Tell waiters this holder is making progress (at most once a second)."""
        now = time.monotonic()
        if force or now - self._last_beat >= BEAT_EVERY_S:
            os.utime(self._fd)
            self._last_beat = now

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
