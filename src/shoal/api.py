"""The Python API, mirroring `shoal train`."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from shoal.checkpoint.attempt import discard_attempt, stage_config
from shoal.config.loading import ConfigSource
from shoal.launch.cores import check_cores
from shoal.launch.environment import external_launch
from shoal.launch.memory import check_memory
from shoal.launch.plan import create_run, plan_job, resume_root
from shoal.launch.process_group import check_devices
from shoal.run import RunPaths
from shoal.run.lock import RunLock
from shoal.run.paths import mark_if_untrained


def train(
    config: ConfigSource | None = None,
    *,
    workers: int | None = None,
    overrides: tuple[str, ...] | list[str] = (),
    resume: str | Path | None = None,
    force: bool = False,
    allow_changes: bool = False,
) -> dict[str, Any]:
    """Train a job and return its results (the content of the run's results.json).

    `config` is a TOML path, a dict or a ShoalConfig; `workers` starts that many
    local worker processes (data-parallel strategies); `overrides` are `--set`
    items such as "train.epochs=3"; `resume` is a run directory (continue from its
    newest checkpoint) or one checkpoint folder; `allow_changes` lets a resume
    change what the run trains (a learning rate, the data...: see
    checkpoint/changes.py). Under torchrun (or as a task of a Slurm `srun` step),
    this process joins the launched job instead of starting workers. More worker
    processes than cores are started with a warning; more than 4 per core are
    refused (ShoalError) unless `force`, as is a job whose estimated memory before its
    first step exceeds what the machine has available (launch/memory.py).

    This process holds the run directory's lock for the whole job (run/lock.py):
    a second job on the same run is refused, naming this one. A run that SIGTERM
    or SIGINT stopped raises RunStopped (its `exit_code` is 128 + the signal)
    after writing its final checkpoint and results.json.

    Examples:
        >>> results = shoal.train("examples/demo.toml", workers=2)
        >>> results["valid"]["accuracy"]
    """
    launch = external_launch()
    if launch is not None:
        from shoal.launch.external import run_external

        return run_external(plan_job(config, overrides, workers, resume, allow_changes), launch)
    with ExitStack() as held:
        # a resumed run is locked before its checkpoints are even read
        root = resume_root(resume) if resume is not None else None
        lock = held.enter_context(RunLock(RunPaths(root).lock)) if root is not None else None
        plan = plan_job(config, overrides, workers, resume, allow_changes)
        check_memory(plan.config, plan.world_size, force)  # before anything is written
        if not plan.in_process:  # before the run directory is created
            source = f"--workers {workers}" if workers is not None else "[strategy] of the config"
            warning = check_cores(plan.world_size, source, force)
            if warning:
                print(f"shoal: warning: {warning}", flush=True)
            note = check_devices(plan.config.run, plan.world_size, plan.shape.shares_gpus)
            if note:
                print(f"shoal: warning: {note}", flush=True)
        paths = create_run(plan)
        if plan.resume_from is not None:  # on the terminal: not a new run
            print(f"shoal: resuming {paths.root} from {plan.resume_from}", flush=True)
        if plan.run_root is None:  # a new run that fails before training gives its name back
            held.callback(_give_back_if_untrained, paths)
        if lock is None:
            lock = held.enter_context(RunLock(paths.lock))
        if plan.in_process:
            from shoal.launch.inprocess import run_in_process

            return run_in_process(plan.config, paths, plan.resume_from, plan.allow_changes)
        from shoal.launch.launcher import LocalLauncher

        config_file = stage_config(paths, plan.config)
        held.callback(discard_attempt, paths)
        LocalLauncher(
            paths,
            plan.config,
            plan.world_size,
            plan.resume_from,
            config_file=config_file,
            allow_changes=plan.allow_changes,
            lock_fd=lock.fd,
        ).run()
        results: dict[str, Any] = json.loads(paths.results.read_text())
        return results


def _give_back_if_untrained(paths: RunPaths) -> None:
    """On the way out of a new run (after its lock is released): a run that wrote no results
    failed, and if it trained nothing its name is given back (`run/paths.py`)."""
    if not paths.results.exists():
        mark_if_untrained(paths)
