"""The worker context: rank, world, device, run directory and logger, handed to every piece."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from shoal.config import ShoalConfig
from shoal.run import RunPaths
from shoal.shape.hosts import Hosts
from shoal.shape.job import JobShape

if TYPE_CHECKING:
    from shoal.runtime.heartbeat import Heartbeat

LaunchMode = Literal["inprocess", "shoal", "torchrun", "slurm"]


@dataclass
class WorkerContext:
    """Everything a strategy, task or trainer needs to know about where it runs.

    `distributed` is True when a torch.distributed process group exists (even of
    size 1); the in-process `local` strategy runs without one and every collective
    helper is then the identity.
    """

    config: ShoalConfig
    paths: RunPaths
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str | None
    launch_mode: LaunchMode
    log: logging.Logger
    #: which ranks share a machine (placement by host, naming a lost host)
    hosts: Hosts
    resume_from: str | None = None
    #: `--allow-changes`: a resume may change what the run trains (checkpoint/changes.py)
    allow_changes: bool = False
    heartbeat: Heartbeat | None = None
    #: how many times the launcher restarted the job before this attempt (recovery/)
    restart: int = 0
    #: the process group of this context's collectives (None: the whole world). A strategy
    #: whose ranks have different roles (parameter-server workers and servers) runs the
    #: trainer on a context of its workers only.
    group: Any = None
    #: the job's store (a torch.distributed Store) under shoal's launcher, else None
    store: Any = None
    #: this process replaces a rank that died while the others kept running (the launcher
    #: restarted it alone, `JobShape.restarts_alone`): it joined no process group of the job
    rejoin: bool = False
    #: the job's shape (`shape/job.py`), computed once when the worker starts its job; its
    #: roles are the strategy's, its rank labels name a rank in a halt's message
    shape: JobShape | None = None

    def describe_rank(self, rank: int) -> str:
        """How messages name `rank`: with its role where the job's shape has roles."""
        return self.shape.describe_rank(rank) if self.shape is not None else f"rank {rank}"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    @property
    def comm_device(self) -> torch.device:
        """Where tensors handed to collectives must live (NCCL: the GPU)."""
        return self.device if self.backend == "nccl" else torch.device("cpu")
