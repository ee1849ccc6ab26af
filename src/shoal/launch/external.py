"""Join a job launched by torchrun (or any launcher that sets RANK, WORLD_SIZE, MASTER_*).

The same config and command run on many machines:
`torchrun --nnodes 2 --nproc-per-node 4 --rdzv-endpoint HOST:PORT -m shoal train job.toml`.
Rank 0 creates the run directory (or takes the resumed one), holds its lock for
the whole job (run/lock.py), and tells the others its name, or why it cannot,
over the process group. Rank 0 writes metrics, results and checkpoints; every
rank writes its log under the same run directory on its own machine.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from shoal.checkpoint.atomic import atomic_write_bytes
from shoal.config import dump_config
from shoal.errors import RunStopped, ShoalError
from shoal.launch.job import run_job
from shoal.launch.plan import JobPlan
from shoal.launch.process_group import Placement, join_process_group, shutdown_process_group
from shoal.launch.reports import write_report
from shoal.monitor.logs import close_logger, worker_logger
from shoal.run import RunPaths, create_run_dir
from shoal.run.lock import RunLock
from shoal.runtime.collectives import barrier, broadcast_bytes
from shoal.runtime.context import WorkerContext
from shoal.runtime.stop import stop_on_signals


@dataclass
class _Peers:
    """Just enough of a context for the collectives used before the run directory exists."""

    rank: int
    world_size: int
    comm_device: torch.device
    distributed: bool = True


def run_under_torchrun(plan: JobPlan) -> dict[str, Any]:
    placement = Placement.from_env()
    rank, world_size = placement.rank, placement.world_size
    config = plan.config
    device, backend = join_process_group(config, placement)
    failed = False
    held = ExitStack()
    try:
        peers = _Peers(rank, world_size, device if backend == "nccl" else torch.device("cpu"))
        claim: dict[str, str] = {}
        if rank == 0:
            try:
                claim = {"root": str(_claim_run(plan, held))}
            except ShoalError as exc:
                claim = {"error": str(exc)}
        announced = json.loads(broadcast_bytes(peers, json.dumps(claim).encode()).decode())
        if "error" in announced:
            failed = True
            raise ShoalError(announced["error"])
        paths = RunPaths(Path(announced["root"]))
        paths.logs.mkdir(parents=True, exist_ok=True)  # other machines may not share the folder
        paths.checkpoints.mkdir(parents=True, exist_ok=True)
        barrier(peers)
        log = worker_logger(rank, paths.log_file(rank))
        ctx = WorkerContext(
            config=config,
            paths=paths,
            rank=rank,
            world_size=world_size,
            local_rank=placement.local_rank,
            local_world_size=placement.local_world_size,
            device=device,
            backend=backend,
            launch_mode="torchrun",
            log=log,
            resume_from=plan.resume_from,
            allow_changes=plan.allow_changes,
        )
        try:
            with stop_on_signals(log):
                results = run_job(ctx)
        except RunStopped as exc:
            log.info("%s", exc)
            raise
        except Exception as exc:
            failed = True
            log.exception("rank %d failed", rank)
            write_report(paths.error_file(rank), rank, -1, exc)
            raise
        finally:
            close_logger(log)
        return results
    finally:
        shutdown_process_group(graceful=not failed)
        held.close()


def _claim_run(plan: JobPlan, held: ExitStack) -> Path:
    """Rank 0: the run directory, created for a new run, and locked in `held`."""
    if plan.run_root is not None:
        held.enter_context(RunLock(RunPaths(plan.run_root).lock))
        return plan.run_root
    paths = create_run_dir(Path(plan.config.run.dir), plan.run_name)
    held.enter_context(RunLock(paths.lock))
    atomic_write_bytes(paths.config, dump_config(plan.config).encode())
    return paths.root
