"""Automatic restarts: what failed, where to resume, how long to wait, what it cost.

The local launcher (launch/launcher.py) asks this module three things when an
attempt of the job fails. May it restart? Only a failure of the machinery (a
worker killed, crashed, hung, stopped, or cut off from its peers), never a
user's error (a config, data or checkpoint problem; non-finite gradients), which
would fail the same way again; and only `faults.max_restarts` times. From
where? The newest checkpoint of the run, whose meta.json must be sealed and
complete (the workers then verify every byte before loading it, issue 18): a
failed attempt's half-written checkpoint is only a hidden temporary folder and
never a candidate, and a damaged `step-*` folder stops the restarts rather than
falling back past it (checkpoint/manager.py's `find_checkpoint` explains why).
No checkpoint yet: the attempt starts again from where the job started. After
how long? `faults.restart_backoff_s`, doubled for each further restart in a row
whose attempt reached no step beyond the state it resumed from.

Each failure, restart and recovery is logged on the launcher's stderr and
appended to metrics.jsonl (`failure`, `restart`, `recovered` events; no worker
runs while the first two are written, and a line is one append), and the job's
results.json gets `restarts`, `failures`, `lost_steps`, `recovery_s` and
`membership_changes` (each rank given up, `[faults] min_workers`).
Recovery time runs from the moment the launcher detected the failure to the
first heartbeat of a step beyond the resumed state; lost steps are the newest
step any rank was known to have reached (its heartbeat or error report) minus
the resumed one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.checkpoint.atomic import atomic_write_json
from shoal.checkpoint.integrity import read_meta
from shoal.checkpoint.manager import find_checkpoint, list_checkpoints
from shoal.config.sections import FaultsConfig
from shoal.errors import ShoalError
from shoal.run import RunPaths


@dataclass
class Failure:
    """One failed attempt, as the launcher saw it."""

    error: ShoalError  # what the job raises if it is not restarted
    rank: int | None  # the rank at fault (None: unknown)
    step: int  # the newest step any rank was known to have reached
    restartable: bool  # a crash, a hang, a lost peer; not a user's error
    detected: float = field(default_factory=time.time)

    @property
    def reason(self) -> str:
        return self.error.lines[0] if self.error.lines else str(self.error)


@dataclass
class ResumePoint:
    """Where a restart resumes: a checkpoint folder and its step (None, -1: the job's start)."""

    path: str | None
    step: int


def newest_state(paths: RunPaths, start: str | None, snapshots: Path | None = None) -> ResumePoint:
    """The newest complete state of the run: its newest checkpoint or, when newer, its newest
    in-memory snapshot (recovery/snapshots.py), else `start` (the checkpoint the job itself
    resumed from, or None). Raises ShoalError for a damaged checkpoint."""
    point = ResumePoint(start, -1)
    if start is not None:
        point = ResumePoint(start, int(read_meta(Path(start)).get("step", -1)))
    if list_checkpoints(paths.checkpoints):
        path = find_checkpoint(paths.root)  # refuses a damaged step-* folder
        meta = read_meta(path)  # sealed, one checksum per file; the worker verifies the bytes
        point = ResumePoint(str(path), int(meta.get("step", -1)))
    for snapshot in reversed(list_checkpoints(snapshots) if snapshots is not None else []):
        try:
            step = int(read_meta(snapshot).get("step", -1))
        except ShoalError:
            continue  # a snapshot is a shortcut: a bad one is passed over for the checkpoint
        if step > point.step:
            point = ResumePoint(str(snapshot), step)
        break
    return point


class RestartLog:
    """The job's restarts: counted, timed, logged and recorded."""

    def __init__(self, paths: RunPaths, faults: FaultsConfig) -> None:
        self.paths, self.faults = paths, faults
        self.records: list[dict[str, Any]] = []
        self.failures_by_rank: dict[int, int] = {}
        self.membership: list[dict[str, Any]] = []  # each rank given up (`shrunk`)
        self._no_progress = 0  # restarts in a row whose attempt made no progress
        self._pending: dict[str, Any] | None = None  # the restart awaiting its first step

    @property
    def count(self) -> int:
        return len(self.records)

    @property
    def pending_step(self) -> int | None:
        """The step a restart resumed from while its first step after it is awaited."""
        return None if self._pending is None else int(self._pending["resume_step"])

    def allows(self, failure: Failure) -> bool:
        return failure.restartable and self.count < self.faults.max_restarts

    def backoff_s(self, made_progress: bool) -> float:
        """How long to wait before this restart (doubling while attempts make no progress)."""
        self._no_progress = 0 if made_progress else self._no_progress + 1
        delay = self.faults.restart_backoff_s * 2 ** max(0, self._no_progress - 1)
        return float(min(delay, self.faults.restart_backoff_max_s))

    def failed(self, failure: Failure) -> None:
        """Record a failure (restarted or not)."""
        if failure.rank is not None:
            self.failures_by_rank[failure.rank] = self.failures_by_rank.get(failure.rank, 0) + 1
        append_event(
            self.paths.metrics,
            {
                "event": "failure",
                "rank": failure.rank,
                "step": failure.step,
                "reason": failure.reason,
                "restartable": failure.restartable,
                "time": failure.detected,
            },
        )

    def restarting(
        self, failure: Failure, point: ResumePoint, backoff_s: float, alone: bool = False
    ) -> str:
        """Record a restart about to happen; returns its log line. `alone`: only the failed
        rank restarts, from `point`, while the others keep their state: no step is redone,
        and it has recovered once the job passes the step it had reached."""
        lost = 0 if alone else max(0, failure.step - max(point.step, 0))
        record = {
            "restart": self.count + 1,
            "rank": failure.rank,
            "reason": failure.reason,
            "step": failure.step,
            "resume_step": point.step,
            "resume_from": point.path,
            "lost_steps": lost,
            "backoff_s": backoff_s,
            "detected": failure.detected,
            "recovered": None,
            "recovery_s": None,
            "alone": alone,
            "awaits_step": failure.step if alone else point.step,
        }
        self.records.append(record)
        self._pending = record
        append_event(self.paths.metrics, {"event": "restart", **record, "time": time.time()})
        where = f"checkpoint step {point.step}" if point.path else "the job's start"
        if alone:
            return (
                f"{failure.reason}; restart {self.count} of {self.faults.max_restarts} "
                f"(faults.max_restarts): rank {failure.rank} alone, from {where}; the other "
                "ranks keep running, no step lost"
            )
        return (
            f"{failure.reason}; restart {self.count} of {self.faults.max_restarts} "
            f"(faults.max_restarts) from {where}, {lost} steps lost, after {backoff_s:g} s"
        )

    def shrunk(self, failure: Failure, members: dict[str, int], floor: str) -> str:
        """Record that the job goes on without the rank at fault (`members`: its membership
        now, `floor`: what allowed it); returns the log line. Ranks are numbered afresh in
        the smaller job: the per-rank counts start again."""
        self.failures_by_rank.clear()
        record = {"event": "membership", "lost_rank": failure.rank, **members,
                  "step": failure.step, "time": time.time()}  # fmt: skip
        append_event(self.paths.metrics, record)
        self.membership.append(record)
        who = " and ".join(
            f"{count} {role.removesuffix('s') if count == 1 else role}"
            for role, count in members.items()
        )
        return (
            f"rank {failure.rank} failed {self.faults.max_rank_failures} times "
            f"(faults.max_rank_failures): the job goes on with {who} ({floor}), the same "
            "global batch"
        )

    def recovered(self, step: int, at: float) -> str | None:
        """The restarted job reached `step` at wall time `at` (its heartbeat's): the pending
        restart's recovery ends if that is past the resumed state. Returns its log line
        (None: nothing pending or not yet)."""
        record = self._pending
        if record is None or step <= record["awaits_step"]:
            return None
        now = at
        record["recovered"] = now
        record["recovery_s"] = round(now - record["detected"], 3)
        self._pending = None
        append_event(
            self.paths.metrics,
            {"event": "recovered", "restart": record["restart"], "step": step, "time": now,
             "recovery_s": record["recovery_s"]},
        )  # fmt: skip
        seconds = record["recovery_s"]
        return f"restart {record['restart']} recovered in {seconds:.1f} s (step {step})"

    def section(self) -> dict[str, Any]:
        """What results.json says about failures and restarts (`counts.failures` too, which
        the driver writes as 0 for a run no failure interrupted)."""
        return {
            "restarts": self.count,
            "failures": self.records,
            "lost_steps": sum(r["lost_steps"] for r in self.records),
            "recovery_s": [r["recovery_s"] for r in self.records],
            "membership_changes": self.membership,
        }

    def add_to_results(self) -> None:
        """Merge `section()` into the results.json the job's rank 0 wrote."""
        try:
            results = json.loads(self.paths.results.read_text())
        except (OSError, ValueError):
            return
        if isinstance(results, dict):
            counts = {**results.get("counts", {}), "failures": len(self.records)}
            atomic_write_json(self.paths.results, {**results, **self.section(), "counts": counts})


def append_event(path: Path, record: dict[str, Any]) -> None:
    """One line appended to metrics.jsonl (one write: it cannot interleave with rank 0's)."""
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
    except OSError:
        return  # the log on stderr still says it
