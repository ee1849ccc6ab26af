"""Start a job's ranks as torchrun would (rank 0 hosts the store), each in a memory cgroup
of its own (cgroup v1 under /sys/fs/cgroup/memory, made by benchmarks/_cgroup.py), and read back each rank's exit code and
peak resident memory (`wait4`'s rusage): what the memory-limit test and the memory table
benchmark run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _cgroup import joiner, memory_cgroup

FACTORIES = Path(__file__).resolve().parent / "tasks" / "module"
_LAUNCH_VARS = ("RANK", "WORLD_", "LOCAL_", "MASTER_", "SLURM_", "TORCHELASTIC", "SHOAL_")


@contextmanager
def memory_cgroups(count: int, limit_bytes: int | None) -> Iterator[list[Path]]:
    """`count` fresh memory cgroups, each limited to `limit_bytes` (None: no limit)."""
    with ExitStack() as groups:
        yield [groups.enter_context(memory_cgroup(f"rank{i}", limit_bytes)) for i in range(count)]


@dataclass
class RankExit:
    code: int
    peak_rss_bytes: int


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(
    job: Path,
    ranks: int,
    groups: list[Path] | None = None,
    timeout: float = 600,
    extra_env: dict[str, str] | None = None,
) -> list[RankExit]:
    """`shoal train JOB` as `ranks` processes of one job (torchrun's variables, rank 0
    hosting the store), rank r in `groups[r]` when given; logs in JOB.rankR.log."""
    port = _free_port()
    procs = []
    for rank in range(ranks):
        env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_VARS)}
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(ranks),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(ranks),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            TORCHELASTIC_USE_AGENT_STORE="False",
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
        )
        env.update(extra_env or {})
        group = groups[rank] if groups is not None else None
        with open(job.with_suffix(f".rank{rank}.log"), "wb") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "shoal", "train", str(job)],
                    env=env,
                    cwd=job.parent,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    preexec_fn=joiner(group) if group is not None else None,
                )
            )
    watchdog = threading.Timer(timeout, lambda: [p.kill() for p in procs])
    watchdog.start()
    try:
        exits = []
        for proc in procs:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            exits.append(RankExit(proc.returncode, usage.ru_maxrss * 1024))
        return exits
    finally:
        watchdog.cancel()


def rank_logs(job: Path) -> str:
    """The tail of each rank's output, for a failure's message."""
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
        for p in sorted(job.parent.glob(f"{job.stem}.rank*.log"))
    )


def llama_job(
    folder: Path,
    name: str,
    strategy: dict[str, Any],
    layers: int,
    width: int,
    steps: int,
    context: int = 32,
    train: dict[str, Any] | None = None,
    monitor: dict[str, Any] | None = None,
) -> Path:
    """A job file training the tests' Hugging Face Llama (`tasks/module/hf_models.py`,
    heads of 64, MLP 4x, windows of `context` bytes) with AdamW for `steps` steps; `train`
    and `monitor` add to those sections."""
    job = {
        "task": {
            "type": "module",
            "factory": "hf_models:llama",
            "import_dir": str(FACTORIES),
            "options": {
                "layers": layers,
                "width": width,
                "heads": width // 64,
                "kv_heads": width // 64,
                "inner": 4,
                "context": context,
            },
        },
        "strategy": strategy,
        "train": {
            "max_steps": steps,
            "batch_size": 8,
            "seed": 3,
            "drop_last": True,
            "optimizer": {"kind": "adamw", "lr": 1e-4},
            **(train or {}),
        },
        "checkpoint": {"every_epochs": 0},
        "run": {"dir": str(folder / "runs"), "name": name},
        "monitor": {"progress": "off", **(monitor or {})},
    }
    path = folder / f"{name}.toml"
    path.write_text(tomli_w.dumps(job))
    return path
