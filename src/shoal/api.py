"""The Python API, mirroring `shoal train`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shoal.config.loading import ConfigSource
from shoal.launch.cores import check_cores
from shoal.launch.plan import create_run, plan_job
from shoal.launch.process_group import launched_by_torchrun


def train(
    config: ConfigSource | None = None,
    *,
    workers: int | None = None,
    overrides: tuple[str, ...] | list[str] = (),
    resume: str | Path | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Train a job and return its results (the content of the run's results.json).

    `config` is a TOML path, a dict or a ShoalConfig; `workers` starts that many
    local worker processes (data-parallel strategies); `overrides` are `--set`
    items such as "train.epochs=3"; `resume` is a run directory (continue from its
    newest checkpoint) or one checkpoint folder. Under torchrun, this process
    joins the launched job instead of starting workers. More worker processes than
    cores are started with a warning; more than 4 per core are refused (ShoalError)
    unless `force`.

    A run that SIGTERM or SIGINT stopped raises RunStopped (its `exit_code` is 128 +
    the signal) after writing its final checkpoint and results.json.

    >>> results = shoal.train("examples/demo.toml", workers=2)
    >>> results["valid"]["accuracy"]
    """
    plan = plan_job(config, overrides, workers, resume)
    if launched_by_torchrun():
        from shoal.launch.external import run_under_torchrun

        return run_under_torchrun(plan)
    if not plan.in_process:
        source = f"--workers {workers}" if workers is not None else "[strategy] of the config"
        warning = check_cores(plan.world_size, source, force)
        if warning:
            print(f"shoal: warning: {warning}", flush=True)
    paths = create_run(plan)
    if plan.in_process:
        from shoal.launch.inprocess import run_in_process

        return run_in_process(plan.config, paths, plan.resume_from)
    from shoal.launch.launcher import LocalLauncher

    LocalLauncher(paths, plan.config, plan.world_size, plan.resume_from).run()
    results: dict[str, Any] = json.loads(paths.results.read_text())
    return results
