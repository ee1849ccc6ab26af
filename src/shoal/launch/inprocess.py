"""Run a one-process job (the `local` strategy) inside the calling process."""

from __future__ import annotations

import sys
from typing import Any

import torch

from shoal.config import ShoalConfig
from shoal.config.custom import own_config
from shoal.errors import RunStopped, ShoalError
from shoal.launch.job import run_job
from shoal.launch.process_group import pick_device
from shoal.launch.reports import write_report
from shoal.monitor.logs import close_logger, worker_logger
from shoal.run import RunPaths
from shoal.runtime.context import WorkerContext
from shoal.runtime.stop import raise_now, stop_on_signals
from shoal.shape.hosts import Hosts


def run_in_process(
    config: ShoalConfig, paths: RunPaths, resume_from: str | None, allow_changes: bool = False
) -> dict[str, Any]:
    fault = config.faults.inject
    if fault is not None and (fault.kind not in ("raise", "nan") or fault.rank != 0):
        raise ShoalError(
            'faults.inject: the local strategy runs in this process; only kind = "raise" or '
            '"nan" on rank 0 can be injected (use strategy data_parallel to test exits and hangs)'
        )
    warning = restarts_warning(config)
    if warning:
        print(f"shoal: warning: {warning}", file=sys.stderr, flush=True)
    log = worker_logger(0, paths.log_file(0))
    if warning:
        log.warning("%s", warning)
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


def restarts_warning(config: ShoalConfig) -> str | None:
    """Why `[faults] max_restarts` (and snapshots) do nothing in this process, and what to do.

    Restarts are the launcher's: it watches worker processes and starts new ones. A job
    that runs inside the calling process has no launcher above it (the process that
    would restart it is the one that died), so the fields are accepted, as in a config
    shared with multi-worker runs, but said to be idle rather than silently ignored."""
    faults = config.faults
    idle = [f"max_restarts = {faults.max_restarts}"] if faults.max_restarts else []
    if faults.snapshot_every_steps:
        idle.append(f"snapshot_every_steps = {faults.snapshot_every_steps}")
    if not idle:
        return None
    kind = config.strategy.type
    field = getattr(own_config(config.strategy), "workers_field", None)
    if kind == "local" or field is None:
        how = (
            'run it in one worker process: [strategy] type = "data_parallel", num_replicas = 1 '
            "(the same training)"
        )
    else:
        how = f"start worker processes: --workers 2 (strategy.{field})"
    fields, verb = " and faults.".join(idle), "does" if len(idle) == 1 else "do"
    return (
        f"faults.{fields} {verb} nothing here: strategy '{kind}' trains inside this process, "
        f"which cannot restart itself; for automatic restarts {how}"
    )
