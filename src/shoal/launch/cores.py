"""Workers against CPU cores: warn when they must share cores, refuse far too many.

Each worker is a process with its own threads; beyond the cores they take turns,
every step waits for the slowest, and start-up (importing torch) alone can pass
`faults.start_timeout_s`. A few more workers than cores is a reasonable test of
a configuration; many times more is almost always a typo.
"""

from __future__ import annotations

import os

from shoal.errors import ShoalError

#: more workers than this per core are refused unless forced
MAX_WORKERS_PER_CORE = 4


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, e.g. under taskset or Slurm)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_cores(workers: int, source: str, force: bool = False) -> str | None:
    """A warning when `workers` processes exceed the cores (None if they fit); raises
    ShoalError when they exceed them more than MAX_WORKERS_PER_CORE times and not `force`.

    `source` names where the number came from (`--workers 64`, `strategy.num_replicas = 64`).
    """
    cores = available_cores()
    if workers <= cores:
        return None
    limit = MAX_WORKERS_PER_CORE * cores
    if workers > limit and not force:
        raise ShoalError(
            f"{source}: {workers} worker processes on {cores} CPU cores would spend their time "
            f"waiting for each other (at most {limit} without --force); start fewer workers, "
            "or pass --force (shoal.train(..., force=True)) to start them anyway"
        )
    return (
        f"{workers} worker processes on {cores} CPU cores ({source}): they share the cores, "
        "so steps are slower than with one worker per core"
    )
