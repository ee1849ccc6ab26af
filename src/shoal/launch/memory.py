"""A job's memory, estimated before it starts: one that cannot fit this machine is refused.

A job that needs more memory than the machine has used to be found out by the kernel
minutes in (the OOM killer, or a swap storm), after every worker had read its data.
What each process holds before its first step follows from the config and the data
files' sizes (each task's section says what it can: `TaskSection.memory_needs`), and
the parameters' copies from the optimizer: the weights, their gradients, the optimizer's
state and the best model kept in memory. Every process of a job on one machine holds its
own copy of the data and the model, so the estimate is per process times the processes.

Embedding tables (a knowledge graph's entities and relations: `TaskSection.table_shapes`,
from the prepared graph's manifest) are where the strategy puts them: whole in every
process, with the optimizer's copies, under data_parallel and the others; spread over
the servers, each row with its row optimizer's state, under parameter_server, once for
the job however many servers hold them; on disk, not in memory, with the parameter
server's `shard_dir`. A prepared graph's triples and filter index are memory-mapped
(the page cache, shared by every process), so they are not counted.

It is an estimate, not a measurement: it is refused only when it exceeds what the
machine has available (`MemAvailable`, or the cgroup's limit when lower), and `--force`
starts the job anyway.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
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


#: floats of state a parameter server's row optimizer keeps for a row of width w
#: (strategies/parameter_server/row_optimizers.py; a test holds the two together)
ROW_STATE: dict[str, Callable[[int], int]] = {
    "sgd": lambda width: 0,
    "adagrad": lambda width: 1,
    "lazy_adam": lambda width: 2 * width + 1,
}


def estimate(config: Any, processes: int) -> tuple[int, str]:
    """(bytes, how they add up) the job holds before its first step on this machine."""
    needed, how, _ = _estimate(config, processes)
    return needed, how


def _estimate(config: Any, processes: int) -> tuple[int, str, bool]:
    """estimate(), and whether it holds embedding tables in memory."""
    task = config.task
    needs = task.memory_needs() if hasattr(task, "memory_needs") else []
    tables = task.table_shapes() if hasattr(task, "table_shapes") else {}
    if not needs and not tables:
        return 0, "", False
    copies, optimizer = parameter_copies(config)
    parts, per_process = [], 0
    for what, data, parameters in needs:
        model = 4 * parameters * copies
        per_process += data + model
        parts.append(
            f"{what}: {data / _GB:.1f} GB; the model: {parameters:,} parameters x {copies} "
            f"copies with {optimizer}: {model / _GB:.1f} GB"
        )
    served, served_part = 0, ""
    if tables and config.strategy.type == "parameter_server":
        served, served_part = _served_tables(config.strategy, tables)
    elif tables:
        if getattr(task, "sparse_gradients", False):
            copies -= 1  # a batch's rows' gradients only
        entries = sum(rows * width for rows, width in tables.values())
        per_process += 4 * entries * copies
        parts.append(
            f"task tables ({_shapes(tables)}): {entries:,} parameters x {copies} copies with "
            f"{optimizer}: {4 * entries * copies / _GB:.1f} GB"
        )
    who = f"{processes} processes x " if processes > 1 else ""
    how = [f"{who}({'; '.join(parts)})"] if parts else []
    how += [served_part] if served_part else []
    in_memory = bool(tables) and (served > 0 or config.strategy.type != "parameter_server")
    return processes * per_process + served, "; ".join(how), in_memory


def _shapes(tables: dict[str, tuple[int, int]]) -> str:
    return ", ".join(f"{name} {rows:,} x {width}" for name, (rows, width) in tables.items())


def _served_tables(strategy: Any, tables: dict[str, tuple[int, int]]) -> tuple[int, str]:
    """Bytes of the tables and their row state on the servers (0 when they live on disk in
    `shard_dir`), and how they add up."""
    kind = strategy.optimizer.kind
    floats = sum(rows * (width + ROW_STATE[kind](width)) for rows, width in tables.values())
    what = f"task tables ({_shapes(tables)}) with {kind}'s row state: {4 * floats / _GB:.1f} GB"
    if strategy.shard_dir is not None:
        return 0, f"{what} on disk in strategy.shard_dir, not in memory"
    return 4 * floats, f"{what} over {strategy.num_servers} servers"


def check_memory(config: Any, processes: int, force: bool = False) -> None:
    """Refuse, in one line with the estimate, a job that cannot fit this machine's memory."""
    needed, how, tables = _estimate(config, processes)
    available = available_memory()
    if force or not needed or available is None or needed <= available:
        return
    remedy = " (or strategy parameter_server with shard_dir: tables on disk)" if tables else ""
    raise ShoalError(
        f"the job needs about {needed / _GB:.1f} GB of memory before its first step, more than "
        f"the {available / _GB:.1f} GB this machine has available: {how}; use less data, a "
        f"smaller model or fewer processes{remedy}, or pass --force to start it anyway"
    )
