"""Turn what the user asked for (config, overrides, workers, resume) into a job plan.

The CLI and the Python API share this, so `shoal train` and `shoal.train()`
accept and reject exactly the same things. Planning writes nothing: a resume's
config (the run's config.toml with `--set` and `--workers` applied) is checked
against what its checkpoint holds (checkpoint/changes.py) and only becomes the
run's config.toml once the resumed run has written something (checkpoint/attempt.py),
so a resume that fails leaves the run as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from shoal.checkpoint.atomic import atomic_write_bytes
from shoal.checkpoint.changes import refuse_changes, resume_changes
from shoal.checkpoint.integrity import read_meta
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
    allow_changes: bool = False  # --allow-changes: a resume may change what the run trains


def strategy_section(config: ShoalConfig) -> str:
    """Where the strategy's own fields live, for `--set` items: a plugin's under
    "strategy.config" (`type = "custom"`)."""
    return "strategy.config" if config.strategy.type == "custom" else "strategy"


def _workers_override(config: ShoalConfig, workers: int | None) -> list[str]:
    if workers is None:
        return []
    if workers < 1:
        raise ConfigError(f"--workers: must be >= 1, got {workers}")
    return strategy_class(config.strategy).workers_override(workers, strategy_section(config))


def resume_root(resume: str | Path) -> Path | None:
    """The run directory `--resume` names (a run or one of its checkpoints), if it is one."""
    target = Path(resume)
    if (target / META_FILE).is_file():
        return target.parent.parent
    return target if RunPaths(target).config.is_file() else None


def plan_job(
    source: ConfigSource | None,
    overrides: tuple[str, ...] | list[str] = (),
    workers: int | None = None,
    resume: str | Path | None = None,
    allow_changes: bool = False,
) -> JobPlan:
    overrides = list(overrides)
    run_root: Path | None = None
    checkpoint: Path | None = None
    if allow_changes and resume is None:
        raise ConfigError(
            "--allow-changes: only with --resume (it allows a resume to change the run)"
        )
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
        source = RunPaths(run_root).config
    if source is None:
        raise ConfigError("no config given: shoal train CONFIG.toml (or --resume RUN_DIR)")
    config = load_config(source, overrides)
    extra = _workers_override(config, workers)
    if extra:
        config = load_config(config, extra)
    cls = strategy_class(config.strategy)
    cls.check(config)
    if config.faults.min_workers and not cls.elastic:
        raise ConfigError(
            f"faults.min_workers: strategy '{config.strategy.type}' cannot go on with fewer "
            "workers than it started with; remove min_workers (restarts keep every worker)"
        )
    workers = cls.members(config)["workers"]
    if config.faults.min_workers > workers:
        raise ConfigError(
            f"faults.min_workers: {config.faults.min_workers} is more than the job's "
            f"{workers} workers; set it to at most {workers} (0: never shrink)"
        )
    if checkpoint is not None:  # the bytes are verified where they are read, by the workers
        rules = cls.resume_rules(config)
        changes = resume_changes(checkpoint, read_meta(checkpoint), config, rules)
        refuse_changes(changes, checkpoint, allow_changes)
    world_size = cls.world_size(config)
    name = config.run.name or default_run_name(source)
    return JobPlan(
        config,
        world_size,
        cls.in_process and world_size == 1,
        name,
        run_root,
        str(checkpoint) if checkpoint is not None else None,
        allow_changes,
    )


def fit_plan(plan: JobPlan, world_size: int) -> tuple[JobPlan, list[str]]:
    """The plan for `world_size` processes, as another launcher (torchrun) started them,
    with the `--set` items that made it (`Strategy.fit_world`; none: the plan as it is)."""
    cls = strategy_class(plan.config.strategy)
    extra = cls.fit_world(plan.config, world_size, strategy_section(plan.config))
    if not extra:
        return plan, []
    return replace(plan, config=load_config(plan.config, extra), world_size=world_size), extra


def create_run(plan: JobPlan) -> RunPaths:
    """The run's folder: the resumed one, or a new one holding the resolved config."""
    if plan.run_root is not None:
        return RunPaths(plan.run_root)
    paths = create_run_dir(Path(plan.config.run.dir), plan.run_name)
    atomic_write_bytes(paths.config, dump_config(plan.config).encode())
    return paths
