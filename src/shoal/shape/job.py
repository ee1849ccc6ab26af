"""The job's shape: how many processes, who does what, and what the job becomes when resized.

After PyTorch-BigGraph's `ProcessRanks` and torchtitan's `ParallelDims`: one
value, computed from the config alone (and, where placement follows the
machines, from the hosts), by the strategy's config section (`shape()`). The
launcher, the planner, recovery, torchrun's joining ranks, `shoal config
validate` and the workers all ask this one value; none of them imports a
strategy's implementation, and no worker computes its roles a second way.

Resizing is the section's too (`with_workers`, `without_rank`, `fitted`): each
returns a new typed section, which `shape/sizing.py` puts into a whole config
and validates again.

Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shoal.shape.roles import RankRoles


@dataclass(frozen=True)
class JobShape:
    """Processes and roles of one job, as its strategy's config lays them out."""

    roles: RankRoles
    #: the membership by role, as `[faults] min_workers` counts it and `membership` records
    #: say it: {"workers": 4} ({"workers": 2, "servers": 2} for a parameter server)
    members: dict[str, int]
    #: the job may run inside the calling process when it has one process
    in_process: bool = False
    #: the job may go on with fewer workers than it started with and train the same problem
    elastic: bool = False
    #: ranks the launcher restarts alone when they die, the others running on (dedicated
    #: parameter servers under `faults.max_restarts`)
    alone: frozenset[int] = frozenset()
    #: why a rank one might expect to be restarted alone is not, by rank (for the log)
    alone_notes: dict[int, str] = field(default_factory=dict)
    #: how failure messages name each rank, by rank: "rank 3 (pipeline stage 1)"; empty:
    #: "rank 3"
    labels: tuple[str, ...] = ()
    #: the workers may share a GPU: every collective and message of the job runs on gloo
    #: and only the workers' compute is on a GPU (a parameter server's workers score there
    #: with the rows they pulled; the rows stay on the CPU), so "auto" puts its workers
    #: on the GPUs however few they are, and its dedicated servers on the CPU
    shares_gpus: bool = False

    @property
    def world_size(self) -> int:
        """The processes the job runs."""
        return self.roles.world_size

    @property
    def workers(self) -> int:
        """Its workers, in the terms a checkpoint counts them (not dedicated servers)."""
        return self.members["workers"]

    def describe_rank(self, rank: int) -> str:
        """How failure messages name `rank`: with its role where the shape has roles."""
        if 0 <= rank < len(self.labels):
            return self.labels[rank]
        return f"rank {rank}"

    def restarts_alone(self, rank: int) -> tuple[bool, str | None]:
        """Whether the launcher restarts `rank` alone when it dies, and a note for the log
        when a rank one might expect to be restarted alone is not (None: nothing to say)."""
        return rank in self.alone, self.alone_notes.get(rank)

    def describe_members(self) -> str:
        """' (2 workers, 1 server)' for a job of several roles; '' for workers alone."""
        if list(self.members) == ["workers"]:
            return ""
        named = (
            f"{n} {role.removesuffix('s') if n == 1 else role}" for role, n in self.members.items()
        )
        return " (" + ", ".join(named) + ")"


@dataclass(frozen=True)
class Shrink:
    """A job going on without one rank it gave up (`[faults] min_workers`)."""

    #: the strategy's section of the smaller job
    section: Any
    #: its membership, as the `membership` record in metrics.jsonl says it: {"workers": 2}
    members: dict[str, int]
    #: the floor that allowed it, for the log line: "faults.min_workers = 2"
    floor: str


def mesh_labels(roles: RankRoles) -> tuple[str, ...]:
    """'rank 3 (data 1, tensor 1)' for each rank of a mesh."""
    return tuple(
        f"rank {rank} ({', '.join(f'{k} {v}' for k, v in roles.coordinates(rank).items())})"
        for rank in range(roles.world_size)
    )


def stage_indices(group_rank: int, ranks: int, local: int) -> list[int]:
    """The stages pipeline rank `group_rank` holds (loop placement: interleaved 1F1B's
    `local` stages a rank are `ranks` apart)."""
    return [group_rank + k * ranks for k in range(local)]


def stage_label(rank: int, ranks: int, local: int) -> str:
    """'rank 1 (pipeline stage 1)', 'rank 0 (pipeline stages 0, 2)'."""
    held = stage_indices(rank, ranks, local)
    word = "stage" if len(held) == 1 else "stages"
    return f"rank {rank} (pipeline {word} {', '.join(map(str, held))})"
