"""A resumed run's new config becomes its config.toml only once the resume has worked.

`--resume RUN --set ...` used to write the overrides into config.toml before
anything was checked, so a resume that failed (the checkpoint did not fit) left a
config that every later plain `--resume` failed on too. Now a resume runs with
its config in memory (or, for shoal's own workers, in `.config.attempt.toml`),
and rank 0 makes it the run's config.toml just before the first checkpoint of
the resumed run is renamed into place, or when the job ends: config.toml always
describes the newest checkpoint, and after a failed resume nothing has changed.
"""

from __future__ import annotations

from pathlib import Path

from shoal.checkpoint.atomic import atomic_write_bytes
from shoal.config import ShoalConfig, dump_config
from shoal.run.paths import RunPaths


def stage_config(paths: RunPaths, config: ShoalConfig) -> Path:
    """The config file this run's worker processes read: config.toml itself when it already
    holds `config`, else the attempt file (written here)."""
    text = dump_config(config).encode()
    if paths.config.is_file() and paths.config.read_bytes() == text:
        return paths.config
    atomic_write_bytes(paths.attempt_config, text)
    return paths.attempt_config


def promote_config(paths: RunPaths, config: ShoalConfig) -> None:
    """Make `config` the run's config.toml (rank 0; a no-op when it already is)."""
    text = dump_config(config).encode()
    if not paths.config.is_file() or paths.config.read_bytes() != text:
        atomic_write_bytes(paths.config, text)


def discard_attempt(paths: RunPaths) -> None:
    paths.attempt_config.unlink(missing_ok=True)
