"""A job's memory, estimated before it starts: one that cannot fit this machine is refused.

A job that needs more memory than the machine has used to be found out by the kernel
minutes in (the OOM killer, or a swap storm), after every worker had read its data.
What each process holds before its first step follows from the config and the data
files' sizes (each task's section says what it can: `TaskSection.memory_needs`), and
the parameters' copies from the optimizer: the weights, their gradients, the optimizer's
state and the best model kept in memory. Every process of a job on one machine holds its
own copy of the data and the model, so the estimate is per process times the processes.

It is an estimate, not a measurement: it is refused only when it exceeds what the
machine has available (`MemAvailable`, or the cgroup's limit when lower), and `--force`
starts the job anyway.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from shoal.errors import ShoalError

_GB = 1e9


def available_memory() -> int | None:
    """Bytes this process could still take: MemAvailable, or less under a cgroup limit."""
    found: list[int] = []
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            found.append(int(limit) - used)
    return min(found) if found else None


def parameter_copies(config: Any) -> tuple[int, str]:
    """How many float32 copies of each parameter a process holds, and the optimizer named."""
    optimizer = config.train.optimizer
    slots = {"sgd": 1 if getattr(optimizer, "momentum", 0) else 0, "adagrad": 1}
    state = slots.get(optimizer.kind, 2)  # adam, adamw, sparse_adam: two moments
    return 3 + state, optimizer.kind  # weights, gradients, the best model, the state


def estimate(config: Any, processes: int) -> tuple[int, str]:
    """(bytes, how they add up) the job holds before its first step on this machine."""
    needs = config.task.memory_needs() if hasattr(config.task, "memory_needs") else []
    if not needs:
        return 0, ""
    copies, optimizer = parameter_copies(config)
    parts, per_process = [], 0
    for what, data, parameters in needs:
        model = 4 * parameters * copies
        per_process += data + model
        parts.append(
            f"{what}: {data / _GB:.1f} GB; the model: {parameters:,} parameters x {copies} "
            f"copies with {optimizer}: {model / _GB:.1f} GB"
        )
    who = f"{processes} processes x " if processes > 1 else ""
    return processes * per_process, f"{who}({'; '.join(parts)})"


def check_memory(config: Any, processes: int, force: bool = False) -> None:
    """Refuse, in one line with the estimate, a job that cannot fit this machine's memory."""
    needed, how = estimate(config, processes)
    available = available_memory()
    if force or not needed or available is None or needed <= available:
        return
    raise ShoalError(
        f"the job needs about {needed / _GB:.1f} GB of memory before its first step, more than "
        f"the {available / _GB:.1f} GB this machine has available: {how}; use less data, a "
        "smaller model or fewer processes, or pass --force to start it anyway"
    )
