"""Was this process started by an outside launcher (torchrun, Slurm's srun), and where is it?

torchrun (and anything that sets its variables: RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) wins over Slurm, so `srun torchrun ...` (one torchrun per node)
joins as torchrun. A task of a multi-task srun step without torchrun joins as
Slurm. Anything else runs shoal's own launcher (or in process). shoal's own
workers carry SHOAL_LAUNCHER and are never taken for an outside launch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from shoal.errors import ShoalError
from shoal.launch.process_group import LAUNCHER_ENV, TORCHRUN_VARS, Placement
from shoal.launch.slurm import SlurmStep
from shoal.recovery.rejoin import agent_identity


@dataclass(frozen=True)
class ExternalLaunch:
    """This process's place in a job that another launcher started."""

    launcher: Literal["torchrun", "slurm"]
    placement: Placement
    master_addr: str
    master_port: int
    #: rank 0 hosts the store itself: a Slurm step's rank 0, and torchrun's rank 0 when its
    #: agents share no store with the workers (TORCHELASTIC_USE_AGENT_STORE=False)
    hosts_store: bool = False
    #: torchrun's agent hosts the store and keeps it from one start of the job to the next
    agent_store: bool = False
    #: which start of the job this is (torchrun's restart count, Slurm's step): the keys
    #: of joining (launch/admission.py) are kept apart per attempt in a store that outlives
    #: one. A store new at each start needs no such key ("torchrun": recovery/rejoin.py)
    attempt: str = "0"
    #: torchrun: how many times it restarted the job (recovery/rejoin.py), and its run id
    restart: int = 0
    run_id: str = ""
    #: torchrun's `--max-restarts` (what `shoal status` says restarts are out of)
    max_restarts: int = 0
    #: torchrun: which agent started this process (recovery/rejoin.py, `agent_identity`)
    agent: str = ""


def external_launch(env: Mapping[str, str] | None = None) -> ExternalLaunch | None:
    env = os.environ if env is None else env
    if LAUNCHER_ENV in env:
        return None
    if all(name in env for name in TORCHRUN_VARS):
        try:
            port = int(env["MASTER_PORT"])
        except ValueError:
            raise ShoalError(f"MASTER_PORT={env['MASTER_PORT']!r}: not a port number") from None
        restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
        most = env.get("TORCHELASTIC_MAX_RESTARTS", "0")
        placement = Placement.from_env(env)
        # torchrun's default: its agent hosts the store and keeps it over restarts (whose
        # count each agent keeps alone); without it (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
        # for torchrun), rank 0 hosts a new one at each start, as torch's env:// would
        shared = env.get("TORCHELASTIC_USE_AGENT_STORE", "True") != "False"
        return ExternalLaunch(
            "torchrun",
            placement,
            env["MASTER_ADDR"],
            port,
            hosts_store=not shared and placement.rank == 0,
            agent_store=shared,
            attempt=f"torchrun-{restart}" if shared else "torchrun",
            restart=int(restart) if restart.isdigit() else 0,
            run_id=env.get("TORCHELASTIC_RUN_ID", ""),
            max_restarts=int(most) if most.isdigit() else 0,
            agent=agent_identity(),
        )
    step = SlurmStep.from_env(env)
    if step is None:
        return None
    placement = Placement(step.rank, step.world_size, step.local_rank, step.local_world_size)
    return ExternalLaunch(
        "slurm",
        placement,
        step.master_addr,
        step.master_port,
        hosts_store=step.rank == 0,
        attempt=f"slurm-{env.get('SLURM_STEP_ID', '0')}",
    )
