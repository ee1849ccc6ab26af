"""Shoal's recovery policy: after a failure, restart or stop, from where, and with whom.

The local launcher (launch/launcher.py) supervises processes: it starts them,
watches them and names the one that failed. What happens next is decided here,
from the config and the run's state alone:

- **restart the job** (`after`): only a failure of the machinery, at most
  `faults.max_restarts` times (recovery/restarts.py's `RestartLog`), from the
  newest complete state (a damaged checkpoint stops the restarts), after the
  backoff. A rank given up `faults.max_rank_failures` times under
  `faults.min_workers` is left out of the next attempt: the job's shape says
  what it becomes without it (`shape/sizing.py without_rank`: one worker fewer
  with the same global batch, or one parameter server fewer, its rows
  re-sharded), down to the floor;
- **restart one rank alone** (`alone`): a rank the job's shape restarts alone
  (a dedicated parameter server) is started again while the others run on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shoal.config import ShoalConfig
from shoal.errors import JobFailed, ShoalError
from shoal.recovery.restarts import Failure, RestartLog, ResumePoint, newest_state
from shoal.run import RunPaths
from shoal.shape.job import JobShape
from shoal.shape.sizing import Shrunk, shape_of, without_rank


@dataclass(frozen=True)
class Restart:
    """The next attempt: where it resumes, after how long, and the job it runs."""

    point: ResumePoint
    backoff_s: float
    #: the job without a rank given up (None: the same job)
    shrunk: Shrunk | None
    #: the launcher's lines for the terminal, in the order their records were written
    notices: list[str]


class RecoveryPolicy:
    """Restart-or-stop decisions of one run, across its attempts."""

    def __init__(
        self, paths: RunPaths, config: ShoalConfig, start: str | None, snapshots: Path | None
    ) -> None:
        """`start`: the checkpoint the job itself resumed from (None: the job's start);
        `snapshots`: the in-memory snapshot folder, when the job takes them."""
        self.paths, self.config, self.start, self.snapshots = paths, config, start, snapshots
        self.restarts = RestartLog(paths, config.faults)
        self.shape: JobShape = shape_of(config)

    def after(self, failure: Failure, stopping: bool) -> Restart:
        """The restart that follows `failure`, or the job's error raised when none does
        (`stopping`: a stop request came in; nothing is restarted then)."""
        restarts = self.restarts
        restarts.failed(failure)
        if stopping or not restarts.allows(failure):
            if failure.restartable and restarts.count:
                raise JobFailed(
                    f"{failure.reason} (after {restarts.count} restarts: "
                    f"faults.max_restarts = {self.config.faults.max_restarts})"
                )
            raise failure.error
        try:
            point = newest_state(self.paths, self.start, self.snapshots)
        except ShoalError as exc:
            raise JobFailed(f"{failure.reason}; not restarted: {exc}") from None
        notices = []
        shrunk = self._shrink(failure)
        if shrunk is not None:
            notices.append(restarts.shrunk(failure, shrunk.members, shrunk.floor))
        # an attempt whose first step after the restart never came made no progress
        backoff = restarts.backoff_s(made_progress=restarts.pending_step is None)
        notices.append(restarts.restarting(failure, point, backoff))
        return Restart(point, backoff, shrunk, notices)

    def _shrink(self, failure: Failure) -> Shrunk | None:
        """Elastic (`[faults] min_workers`): the job without a rank that failed
        `max_rank_failures` times (None: every rank stays, or the floor is reached)."""
        if failure.rank is None or not self.given_up(failure.rank, 0):
            return None
        shrunk = without_rank(self.config, failure.rank)
        if shrunk is not None:
            self.config, self.shape = shrunk.config, shape_of(shrunk.config)
        return shrunk

    def given_up(self, rank: int, more: int) -> bool:
        """Whether `rank` has failed `faults.max_rank_failures` times, counting `more` not
        yet recorded (elastic only: without min_workers no rank is given up)."""
        faults = self.config.faults
        if not faults.min_workers:
            return False
        return self.restarts.failures_by_rank.get(rank, 0) + more >= faults.max_rank_failures

    def alone(self, failure: Failure) -> ResumePoint | None:
        """Where a rank the shape restarts alone resumes, when it may be restarted now; None:
        the whole job fails or restarts (not such a rank, no restart left, a rank given up,
        a damaged state). Records the failure when it is restarted alone."""
        rank = failure.rank
        if rank is None or not self.shape.restarts_alone(rank)[0]:
            return None
        if not self.restarts.allows(failure):
            return None
        if self.given_up(rank, 1) and without_rank(self.config, rank) is not None:
            return None  # given up: the job restarts without it (`after`)
        try:
            point = newest_state(self.paths, self.start, self.snapshots)
        except ShoalError:
            return None  # the whole job fails or restarts, and says why
        self.restarts.failed(failure)
        return point
