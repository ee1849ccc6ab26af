"""A job step started by Slurm's `srun`: rank, world and master from Slurm's environment.

`srun --ntasks-per-node 2 shoal train job.toml` starts every process itself, so
shoal needs no torchrun there: srun sets, for each task of the step,

- SLURM_PROCID (rank), SLURM_STEP_NUM_TASKS (world size), SLURM_LOCALID (local
  rank), SLURM_NODEID (node index),
- SLURM_STEP_TASKS_PER_NODE, e.g. "2(x3),1" (tasks on each node, in node order),
- SLURM_STEP_NODELIST, e.g. "node[01-03,07]" (the step's nodes, compressed).

The job's store is hosted by rank 0 at MASTER_ADDR:MASTER_PORT. Where the user
exported those (as many sbatch scripts do) they are used; otherwise the address
is the step's first node (rank 0 runs there: Slurm places tasks in node order)
and the port is derived from the job id, 20000 + SLURM_JOB_ID % 10000, the same
on every node without any exchange. Two steps of one job that run at the same
time on one node would need different MASTER_PORTs: export them.

A shell inside an allocation (sbatch's batch script, salloc) has SLURM_* too
but is not a task of a step: only a step with more than one task (srun sets
SLURM_STEP_NUM_TASKS) is joined; otherwise shoal starts its own workers.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass

from shoal.errors import ShoalError

PORT_BASE, PORT_SPAN = 20000, 10000


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list, expanded: "gpu[01-02,5],login" -> gpu01, gpu02, gpu5, login.

    Ranges keep their zero padding; several bracket groups in one name expand as a
    product ("r[1-2]n[1-2]" -> r1n1, r1n2, r2n1, r2n2).
    """
    names: list[str] = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", nodelist):
        parts = re.split(r"(\[[^\]]*\])", item)
        choices: list[list[str]] = []
        for part in parts:
            if part.startswith("["):
                choices.append(_expand_ranges(part[1:-1], nodelist))
            elif part:
                choices.append([part])
        names.extend("".join(combo) for combo in itertools.product(*choices))
    if not names:
        raise ShoalError(f"SLURM_STEP_NODELIST={nodelist!r}: no node names in it")
    return names


def _expand_ranges(ranges: str, nodelist: str) -> list[str]:
    out: list[str] = []
    for piece in ranges.split(","):
        bounds = re.fullmatch(r"(\d+)(?:-(\d+))?", piece.strip())
        if bounds is None:
            raise ShoalError(f"SLURM_STEP_NODELIST={nodelist!r}: cannot read the range {piece!r}")
        low, high = bounds.group(1), bounds.group(2) or bounds.group(1)
        width = len(low)
        out.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return out


def expand_tasks_per_node(spec: str) -> list[int]:
    """ "2(x3),1" -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for piece in spec.split(","):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", piece.strip())
        if found is None:
            raise ShoalError(f"SLURM_STEP_TASKS_PER_NODE={spec!r}: cannot read {piece!r}")
        counts.extend([int(found.group(1))] * int(found.group(2) or 1))
    return counts


@dataclass(frozen=True)
class SlurmStep:
    """This task's place in an srun step."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SlurmStep | None:
        """The step this process is a task of (None: not a task of a multi-task step)."""
        if "SLURM_STEP_NUM_TASKS" not in env or "SLURM_PROCID" not in env:
            return None
        try:
            world_size = int(env["SLURM_STEP_NUM_TASKS"])
            if world_size < 2:
                return None
            rank, node = int(env["SLURM_PROCID"]), int(env.get("SLURM_NODEID", "0"))
            local_rank = int(env.get("SLURM_LOCALID", "0"))
            per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
            local_world = expand_tasks_per_node(per_node)[node] if per_node else 1
            port = env.get("MASTER_PORT") or str(
                PORT_BASE + int(env.get("SLURM_JOB_ID", "0")) % PORT_SPAN
            )
            master_port = int(port)
        except (ValueError, IndexError) as exc:
            raise ShoalError(f"Slurm environment: cannot read this task's place ({exc})") from None
        master = env.get("MASTER_ADDR")
        if not master:
            nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
            if not nodelist:
                raise ShoalError(
                    "Slurm environment: neither MASTER_ADDR nor SLURM_STEP_NODELIST is set; "
                    "export MASTER_ADDR (the first node's address) before srun"
                )
            master = expand_nodelist(nodelist)[0]
        return cls(rank, world_size, local_rank, local_world, node, master, master_port)
