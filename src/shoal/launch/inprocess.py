"""Run a one-process job (the `local` strategy) inside the calling process."""

from __future__ import annotations

from typing import Any

import torch

from shoal.config import ShoalConfig
from shoal.errors import RunStopped, ShoalError
from shoal.launch.job import run_job
from shoal.launch.process_group import pick_device
from shoal.launch.reports import write_report
from shoal.monitor.logs import close_logger, worker_logger
from shoal.run import RunPaths
from shoal.runtime.context import WorkerContext
from shoal.runtime.hosts import Hosts
from shoal.runtime.stop import raise_now, stop_on_signals


def run_in_process(
    config: ShoalConfig, paths: RunPaths, resume_from: str | None, allow_changes: bool = False
) -> dict[str, Any]:
    fault = config.faults.inject
    if fault is not None and (fault.kind not in ("raise", "nan") or fault.rank != 0):
        raise ShoalError(
            'faults.inject: the local strategy runs in this process; only kind = "raise" or '
            '"nan" on rank 0 can be injected (use strategy data_parallel to test exits and hangs)'
        )
    log = worker_logger(0, paths.log_file(0))
    threads_before = torch.get_num_threads()
    try:
        if config.run.threads_per_worker:
            torch.set_num_threads(config.run.threads_per_worker)
        ctx = WorkerContext(
            config=config,
            paths=paths,
            rank=0,
            world_size=1,
            local_rank=0,
            local_world_size=1,
            device=pick_device(config.run, 0),
            backend=None,
            launch_mode="inprocess",
            log=log,
            hosts=Hosts.single(1),
            resume_from=resume_from,
            allow_changes=allow_changes,
        )
        with stop_on_signals(log, at_once=raise_now):
            return run_job(ctx)
    except RunStopped:
        raise
    except Exception as exc:
        if not isinstance(exc, ShoalError):
            log.exception("training failed")
        write_report(paths.error_file(0), 0, -1, exc)
        raise
    finally:
        torch.set_num_threads(threads_before)
        close_logger(log)
