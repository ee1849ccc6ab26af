"""Layout of a run directory, and creating one without ever reusing an existing one."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
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


#: in a run directory whose job failed before it trained anything: the name may be reused
UNTRAINED_MARK = ".failed-before-training"
#: metrics.jsonl events that say a run trained (or evaluated) something worth keeping
_TRAINED_EVENTS = ("train", "eval", "checkpoint", "round", "generation", "test")


def mark_if_untrained(paths: RunPaths) -> None:
    """After a new run's job failed: mark its folder reusable when it holds nothing to keep
    (no checkpoint, no results, no training or evaluation line), so that the next run of
    the same config takes `<name>` again instead of `<name>-2`. The folder stays until
    then: the failure message names its logs."""
    with contextlib.suppress(OSError):
        for folder in (paths.checkpoints, paths.best):
            if folder.is_dir() and any(folder.iterdir()):
                return
        if paths.results.exists() or _trained(paths.metrics):
            return
        (paths.root / UNTRAINED_MARK).write_text("this run failed before training\n")


def _trained(metrics: Path) -> bool:
    if not metrics.exists():
        return False
    for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("event") in _TRAINED_EVENTS:
                return True
    return False


def _reclaim(candidate: Path) -> bool:
    """Empty `candidate` if it is a run that failed before training (marked so) and no job
    holds it; True when it was moved away (the caller then creates it afresh). The folder
    is renamed first, atomically: of two jobs reclaiming it, one wins."""
    if not (candidate / UNTRAINED_MARK).is_file():
        return False
    try:
        fd = os.open(candidate / "run.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False  # a job holds it (a resume of it)
    trash = candidate.with_name(f".{candidate.name}.reclaimed-{os.getpid()}")
    try:
        os.rename(candidate, trash)
    except OSError:
        return False
    finally:
        os.close(fd)
    if not (trash / UNTRAINED_MARK).is_file():  # another job's new folder: give it back
        with contextlib.suppress(OSError):
            os.rename(trash, candidate)
        return False
    shutil.rmtree(trash, ignore_errors=True)
    return True


def create_run_dir(parent: Path, name: str) -> RunPaths:
    """Create `parent/name`, or `name-2`, `name-3`, ... if taken: a run never lands in another's
    (a run that failed before training, `mark_if_untrained`, gives its name back).

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
            if not _reclaim(candidate):
                continue
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
