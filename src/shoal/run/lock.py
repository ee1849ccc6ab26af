"""One run directory, one writer: an exclusive lock held for the whole job.

Two `shoal train --resume` of the same run used to both train and interleave
their metrics and checkpoints. The process that owns a run (the local launcher,
the in-process runner, or rank 0 under torchrun) holds `fcntl.flock` on
`run.lock` for as long as the job runs, and writes its pid, host and start time
into the file so that a second job can say who holds it. The local launcher
hands the locked descriptor to its workers, so the lock stays held until the
last process of the job has exited, not only its launcher.

The kernel releases a flock when the last descriptor of it closes, however the
process ended: a SIGKILLed run leaves no stale lock, and no pid is ever
guessed to be dead. A holder that has just died may still have workers exiting
(they get SIGTERM with their launcher); the lock is waited for, a few seconds,
only in that case.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from types import TracebackType

from shoal.errors import ShoalError

DEAD_HOLDER_WAIT_S = 10.0


class RunInUse(ShoalError):
    """Another job holds the run directory."""


class RunLock:
    """`with RunLock(paths.lock):` holds the run for the block; raises RunInUse if taken."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def fd(self) -> int:
        if self._fd is None:
            raise RuntimeError("the run lock is not held")
        return self._fd

    def acquire(self) -> RunLock:
        fd = self._open()
        deadline: float | None = None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _read_holder(fd)
                if deadline is None and not alive_here(holder):
                    deadline = time.monotonic() + DEAD_HOLDER_WAIT_S
                if deadline is None or time.monotonic() >= deadline:
                    os.close(fd)
                    raise RunInUse(_in_use_message(self.path.parent, holder)) from None
                time.sleep(0.1)
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self._fd = fd
        return self

    def _open(self) -> int:
        """The lock file, never followed through a link (a `run.lock` made a link to a
        user's file would be truncated); what is in the way is named in one line."""
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except IsADirectoryError:
            what = "is a folder"
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise ShoalError(
                    f"{self.path}: cannot open the run's lock: {exc.strerror}"
                ) from None
            what = "is a symbolic link"
        raise ShoalError(
            f"{self.path}: {what}, not the lock file shoal keeps there; move it out of the run "
            "directory and run again"
        )

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _read_holder(fd: int) -> dict[str, object]:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def alive_here(holder: dict[str, object]) -> bool:
    """False only when the holder ran on this host and its pid is gone (its workers may
    still be exiting); anything unknown counts as alive."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int):
        return True
    if not 0 < pid < 2**31:  # not a process id (0 and negatives would name process groups)
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _in_use_message(root: Path, holder: dict[str, object]) -> str:
    if holder.get("pid") is None:
        who = "another shoal job (it has not written its name yet)"
    else:
        who = (
            f"another shoal job: pid {holder.get('pid')} on {holder.get('host')}, started "
            f"{holder.get('started')}"
        )
        if not alive_here(holder):
            who += " (that process has exited; its workers are still stopping)"
    return (
        f"{root}: in use by {who}; one run directory has one writer: wait for that job to end "
        "or stop it, then resume"
    )
