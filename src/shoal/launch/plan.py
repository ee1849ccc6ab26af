"""Turn what the user asked for (config, overrides, workers, resume) into a job plan.

The CLI and the Python API share this, so `shoal train` and `shoal.train()`
accept and reject exactly the same things.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shoal.checkpoint.atomic import atomic_write_bytes
from shoal.checkpoint.manager import META_FILE, find_checkpoint
from shoal.config import ShoalConfig, dump_config, load_config
from shoal.config.loading import ConfigSource, default_run_name
from shoal.errors import ConfigError, ShoalError
from shoal.run import RunPaths, create_run_dir
from shoal.strategies.registry import strategy_class


@dataclass
class JobPlan:
    config: ShoalConfig
    world_size: int
    in_process: bool
    run_name: str
    run_root: Path | None = None  # set for a resume; a fresh run's folder is created at launch
    resume_from: str | None = None  # checkpoint folder


def _workers_override(config: ShoalConfig, workers: int | None) -> list[str]:
    if workers is None:
        return []
    if workers < 1:
        raise ConfigError(f"--workers: must be >= 1, got {workers}")
    return strategy_class(config.strategy.type).workers_override(workers)


def plan_job(
    source: ConfigSource | None,
    overrides: tuple[str, ...] | list[str] = (),
    workers: int | None = None,
    resume: str | Path | None = None,
) -> JobPlan:
    overrides = list(overrides)
    run_root: Path | None = None
    resume_from: str | None = None
    if resume is not None:
        if source is not None:
            raise ConfigError(
                "pass either a config or --resume RUN_DIR: a resumed run uses its own config "
                "(change it with --set)"
            )
        target = Path(resume)
        if not target.exists():
            raise ShoalError(f"--resume {target}: no such run directory or checkpoint")
        checkpoint = find_checkpoint(target)
        run_root = checkpoint.parent.parent if (target / META_FILE).is_file() else target
        resume_from = str(checkpoint)
        source = RunPaths(run_root).config
    if source is None:
        raise ConfigError("no config given: shoal train CONFIG.toml (or --resume RUN_DIR)")
    config = load_config(source, overrides)
    extra = _workers_override(config, workers)
    if extra:
        config = load_config(config, extra)
    if run_root is not None and (overrides or extra):
        atomic_write_bytes(RunPaths(run_root).config, dump_config(config).encode())
    cls = strategy_class(config.strategy.type)
    world_size = cls.world_size(config)
    name = config.run.name or default_run_name(source)
    return JobPlan(
        config, world_size, cls.in_process and world_size == 1, name, run_root, resume_from
    )


def create_run(plan: JobPlan) -> RunPaths:
    """The run's folder: the resumed one, or a new one holding the resolved config."""
    if plan.run_root is not None:
        return RunPaths(plan.run_root)
    paths = create_run_dir(Path(plan.config.run.dir), plan.run_name)
    atomic_write_bytes(paths.config, dump_config(plan.config).encode())
    return paths
