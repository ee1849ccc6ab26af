"""Layout of a run directory, and creating one without ever reusing an existing one."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from shoal.errors import ShoalError


@dataclass(frozen=True)
class RunPaths:
    """Every file of a run, by role.

    runs/<name>/
        config.toml          the resolved config (defaults filled in, paths absolute)
        metrics.jsonl        one JSON object per logging interval and evaluation
        tensorboard/         the same scalars as TensorBoard event files ([monitor] tensorboard)
        wandb/               W&B's files of the run ([monitor] wandb without a dir)
        results.json         final metrics, wall time, world size, strategy
        logs/rank-<r>.log    one log per rank (and rank-<r>.error.json if it failed)
        checkpoints/step-<n> one folder per checkpoint
        best/step-<n>        the checkpoint with the best validation metric so far
        run.lock             held by the process that owns the run while a job runs
        .config.attempt.toml a resumed run's new config, until it has written something
    """

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def attempt_config(self) -> Path:
        """The config a resume runs with, before it becomes config.toml (checkpoint/attempt.py)."""
        return self.root / ".config.attempt.toml"

    @property
    def lock(self) -> Path:
        return self.root / "run.lock"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def results(self) -> Path:
        return self.root / "results.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def best(self) -> Path:
        return self.root / "best"

    def log_file(self, rank: int) -> Path:
        return self.logs / f"rank-{rank}.log"

    def output_file(self, rank: int) -> Path:
        """Where a worker's stdout and stderr go when they are not shown on the terminal."""
        return self.logs / f"rank-{rank}.out"

    def error_file(self, rank: int) -> Path:
        return self.logs / f"rank-{rank}.error.json"


def create_run_dir(parent: Path, name: str) -> RunPaths:
    """Create `parent/name`, or `name-2`, `name-3`, ... if taken: a run never lands in another's.

    `os.mkdir` is atomic, so two jobs started at the same moment cannot both claim a name.
    """
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ShoalError(
            f"run.dir: {parent} is not a folder (a file is in the way); set run.dir to a "
            "folder (it is created if missing)"
        ) from None
    except OSError as exc:
        raise ShoalError(
            f"run.dir: cannot create {parent}: {exc.strerror}; set run.dir to a folder you can "
            "write to"
        ) from None
    for attempt in range(1, 10_000):
        candidate = parent / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        except OSError as exc:
            raise ShoalError(
                f"run.dir: cannot create {candidate}: {exc.strerror}; set run.dir to a folder "
                "you can write to"
            ) from None
        paths = RunPaths(candidate)
        paths.logs.mkdir()
        paths.checkpoints.mkdir()
        return paths
    raise RuntimeError(f"no free run name under {parent} for {name!r}")
