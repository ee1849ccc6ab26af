"""`shoal status RUN_DIR`: every rank's role, state, step, heartbeat age and restarts.

After the seeds' worker registry (`WorkerInfo`, `WorkerStatus`). The local
launcher knows all of it (its workers' processes, their authenticated heartbeats,
which say what each rank is doing and in which role, and its own restarts), so it
keeps `status.json` in the run directory, rewritten atomically twice a second
while the job runs and once more when it ends. Under torchrun or Slurm there is no
such launcher: rank 0's host watch (launch/hostwatch.py), which reads every rank's
heartbeat anyway, keeps the same file once a heartbeat interval, and torchrun's
restart count is the job's. `shoal status` reads that file: it
needs no connection to the job, works the same while the job runs and after it
ended, and reads nothing the workers wrote. A rank's state is one of
starting, training, evaluating, checkpointing (what its heartbeat says), or
failed, restarting, done, stopped (what the launcher saw).
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any

from shoal.checkpoint.atomic import atomic_write_json
from shoal.errors import ShoalError
from shoal.run import RunPaths
from shoal.run.lock import alive_here

STATUS_FILE = "status.json"
#: what a terminal would act on instead of print: C0 and C1 controls (escape sequences
#: start with ESC or CSI), DEL, and the bidirectional overrides that reorder what is shown
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: the job's states; the first two mean a launcher is (or was, if it died) in charge
JOB_STATES = ("running", "restarting", "done", "failed", "stopped")


@dataclass
class RankStatus:
    rank: int
    role: str
    state: str
    step: int
    beat: float | None  # wall time of its newest heartbeat
    restarts: int  # how many times this rank's process was started again
    failures: int  # how many of the job's failures this rank caused
    pid: int | None


class StatusBoard:
    """The launcher's side: writes status.json."""

    def __init__(self, paths: RunPaths, max_restarts: int) -> None:
        self.path = paths.root / STATUS_FILE
        self.max_restarts = max_restarts
        self.started = time.time()

    def write(self, state: str, restarts: int, ranks: list[RankStatus]) -> None:
        data = {
            "state": state,
            "launcher": {"pid": os.getpid(), "host": socket.gethostname()},
            "started": self.started,
            "updated": time.time(),
            "restarts": restarts,
            "max_restarts": self.max_restarts,
            "ranks": [asdict(r) for r in ranks],
        }
        try:
            atomic_write_json(self.path, data)
        except OSError:
            return  # a full disk must not end the job; the next write may succeed


def read_status(paths: RunPaths) -> dict[str, Any]:
    """status.json of a run; ShoalError (one line) when there is none to read."""
    path = paths.root / STATUS_FILE
    if not paths.root.is_dir():
        raise ShoalError(f"shoal status {paths.root}: no such run directory")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShoalError(
            f"{path}: missing; a job keeps one once its worker processes started (shoal's "
            "own launcher, torchrun or Slurm), never one trained inside the calling process "
            "(strategy local)"
        ) from None
    except (OSError, ValueError) as exc:
        raise ShoalError(f"{path}: unreadable ({exc}); it is rewritten as the job runs") from None
    if not isinstance(data, dict) or not isinstance(data.get("ranks"), list):
        raise ShoalError(f"{path}: not a status file written by shoal")
    return data


def printable(value: object) -> str:
    """`value` as text a terminal shows as it is: each control character becomes its
    escape (`\\x1b`). status.json lies in the run directory, which anyone who can write
    there can edit: a role of "\\x1b]52;..." must not reach the terminal that prints it."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], str(value))


def _seconds_ago(now: float, then: object) -> float | None:
    if isinstance(then, bool) or not isinstance(then, int | float) or not math.isfinite(then):
        return None
    return max(0.0, now - then)


def status_lines(paths: RunPaths, now: float | None = None) -> list[str]:
    """What `shoal status` prints: a header line, then a table of the ranks (every field
    read from the file made printable)."""
    data = read_status(paths)
    now = time.time() if now is None else now
    state = printable(data.get("state"))
    launcher = data.get("launcher")  # {pid, host}: as the run lock names its holder
    gone = isinstance(launcher, dict) and not alive_here(launcher)
    running = state in ("running", "restarting")
    updated = _seconds_ago(now, data.get("updated", now))
    if running and gone:
        state += " (its launcher is gone: the job ended without finishing)"
    elif running:
        state += f" (updated {updated:.1f} s ago)" if updated is not None else " (updated ?)"
    header = (
        f"{printable(paths.root)}: {state}; restarts {printable(data.get('restarts', 0))} of "
        f"{printable(data.get('max_restarts', 0))} (faults.max_restarts)"
    )
    rows = [("rank", "role", "state", "step", "heartbeat", "restarts", "failures")]
    for rank in data["ranks"]:
        if not isinstance(rank, dict):
            continue
        age = _seconds_ago(now, rank.get("beat"))
        step = rank.get("step", -1)
        rows.append(
            (
                printable(rank.get("rank")),
                printable(rank.get("role")),
                printable(rank.get("state")),
                str(step) if isinstance(step, int) and step >= 0 else "-",
                f"{age:.1f} s ago" if age is not None else "-",
                printable(rank.get("restarts", 0)),
                printable(rank.get("failures", 0)),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    table = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return [header, *table]
