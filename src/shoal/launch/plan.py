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
from shoal.checkpoint.changes import refuse_changes, resume_changes, resume_rules
from shoal.checkpoint.integrity import read_meta
from shoal.checkpoint.manager import META_FILE, find_checkpoint
from shoal.config import ShoalConfig, dump_config, load_config
from shoal.config.loading import ConfigSource, default_run_name
from shoal.errors import ConfigError, ShoalError
from shoal.run import RunPaths, create_run_dir
from shoal.shape.job import JobShape
from shoal.shape.sizing import fitted_to, shape_of, with_workers


@dataclass(frozen=True)
class JobPlan:
    config: ShoalConfig
    shape: JobShape  # the job's processes and roles, from the config alone
    run_name: str
    run_root: Path | None = None  # set for a resume; a fresh run's folder is created at launch
    resume_from: str | None = None  # checkpoint folder
    allow_changes: bool = False  # --allow-changes: a resume may change what the run trains

    @property
    def world_size(self) -> int:
        return self.shape.world_size

    @property
    def in_process(self) -> bool:
        """The job runs inside the calling process (no worker processes)."""
        return self.shape.in_process and self.shape.world_size == 1


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
    config = load_config(source, overrides)  # validated once, every rule of the config's
    if workers is not None:
        if workers < 1:
            raise ConfigError(f"--workers: must be >= 1, got {workers}")
        config = with_workers(config, workers)  # a typed section, validated again
    if checkpoint is not None:  # the bytes are verified where they are read, by the workers
        changes = resume_changes(checkpoint, read_meta(checkpoint), config, resume_rules(config))
        refuse_changes(changes, checkpoint, allow_changes)
    name = config.run.name or default_run_name(source)
    return JobPlan(
        config,
        shape_of(config),
        name,
        run_root,
        str(checkpoint) if checkpoint is not None else None,
        allow_changes,
    )


def fit_plan(plan: JobPlan, world_size: int) -> tuple[JobPlan, bool]:
    """The plan for `world_size` processes, as another launcher (torchrun) started them, and
    whether it had to change (the strategy's `fitted` section: a host lost or back)."""
    config = fitted_to(plan.config, world_size)
    if config is plan.config:
        return plan, False
    return replace(plan, config=config, shape=shape_of(config)), True


def create_run(plan: JobPlan) -> RunPaths:
    """The run's folder: the resumed one, or a new one holding the resolved config."""
    if plan.run_root is not None:
        return RunPaths(plan.run_root)
    paths = create_run_dir(Path(plan.config.run.dir), plan.run_name)
    atomic_write_bytes(paths.config, dump_config(plan.config).encode())
    return paths
