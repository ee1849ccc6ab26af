"""The Python API, mirroring `shoal train`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shoal.config.loading import ConfigSource
from shoal.launch.environment import external_launch
from shoal.launch.plan import create_run, plan_job


def train(
    config: ConfigSource | None = None,
    *,
    workers: int | None = None,
    overrides: tuple[str, ...] | list[str] = (),
    resume: str | Path | None = None,
) -> dict[str, Any]:
    """Train a job and return its results (the content of the run's results.json).

    `config` is a TOML path, a dict or a ShoalConfig; `workers` starts that many
    local worker processes (data-parallel strategies); `overrides` are `--set`
    items such as "train.epochs=3"; `resume` is a run directory (continue from its
    newest checkpoint) or one checkpoint folder. Under torchrun (or as a task of
    a Slurm `srun` step), this process joins the launched job instead of starting
    workers.

    >>> results = shoal.train("examples/demo.toml", workers=2)
    >>> results["valid"]["accuracy"]
    """
    plan = plan_job(config, overrides, workers, resume)
    launch = external_launch()
    if launch is not None:
        from shoal.launch.external import run_external

        return run_external(plan, launch)
    paths = create_run(plan)
    if plan.in_process:
        from shoal.launch.inprocess import run_in_process

        return run_in_process(plan.config, paths, plan.resume_from)
    from shoal.launch.launcher import LocalLauncher

    LocalLauncher(paths, plan.config, plan.world_size, plan.resume_from).run()
    results: dict[str, Any] = json.loads(paths.results.read_text())
    return results
