"""One worker bootstrap, however the process was started.

Every worker process runs :func:`run_worker`, whether shoal's own launcher
forked it (`launch/worker.py`), torchrun started it, or it is a task of a Slurm
step (`launch/external.py`): it *arrives* (joins the job's store and process
group, learns its run directory, starts its heartbeat, under the stop signals),
runs the job (`launch/job.py`), says why it failed where the launcher above it
reads it, and leaves the process group, gracefully only when every rank did
well. What differs between launchers is an :class:`Arrival`: how a rank finds
its peers and its run, and how it reports.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from shoal.errors import RunStopped
from shoal.launch.job import run_job
from shoal.launch.process_group import Placement, shutdown_process_group
from shoal.monitor.logs import close_logger
from shoal.runtime.context import WorkerContext


def placed_context(placement: Placement, **fields: Any) -> WorkerContext:
    """The worker context of a rank at `placement` (its rank and world, on its host too)."""
    return WorkerContext(
        rank=placement.rank,
        world_size=placement.world_size,
        local_rank=placement.local_rank,
        local_world_size=placement.local_world_size,
        **fields,
    )


@dataclass
class Arrived:
    """A rank in its job: its context (run directory, peers, device) and its log."""

    ctx: WorkerContext
    log: logging.Logger


class Arrival(ABC):
    """How a rank arrives in its job, and how it says it failed."""

    @abstractmethod
    def arrive(self, held: ExitStack) -> Arrived:
        """Join the job: what must be released when the worker ends goes into `held` (the
        stop signals' handler, the run's lock, the store). Raises what stops the job."""

    def completed(self) -> None:  # noqa: B027 - optional hook
        """After the job completed (not stopped, not failed)."""

    def report(self, exc: Exception, arrived: Arrived | None) -> Exception | None:
        """After a failure: leave a report where the launcher reads it; a better error to
        raise instead (a lost host named), or None."""
        return None

    def finish(self, ok: bool) -> None:  # noqa: B027 - optional hook
        """After the job, ended well or not (stop a heartbeat, a watch)."""


def run_worker(arrival: Arrival) -> dict[str, Any]:
    """Arrive, run the job, report a failure, leave: the one path of every worker process.

    A run a stop request ended raises RunStopped (its exit code is 128 + the signal) once
    its checkpoint and results are written; any other failure is reported and raised."""
    failed = False
    arrived: Arrived | None = None
    with ExitStack() as held:
        try:
            arrived = arrival.arrive(held)
            results = run_job(arrived.ctx)
            arrival.completed()
            return results
        except RunStopped as exc:  # a stop request, taken at a step boundary: not a failure
            if arrived is not None:
                arrived.log.info("%s", exc)
            raise
        except Exception as exc:
            failed = True
            better = arrival.report(exc, arrived)
            if better is not None:
                raise better from exc
            raise
        finally:
            arrival.finish(ok=not failed)
            shutdown_process_group(graceful=not failed)
            if arrived is not None:
                close_logger(arrived.log)
