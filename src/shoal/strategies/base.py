"""The strategy interface: one object decides how the work is distributed.

A strategy answers three questions: how many worker processes it needs, what
happens to gradients between backward and the optimizer step (`attach` returns a
:class:`~shoal.training.contracts.GradientSync`), and what the job loop is
(`run`; by default the step loop, `training/steps.py`, under the one driver,
`training/driver.py`). `local` and `data_parallel` differ only in the gradient
sync; a strategy with another unit (federated rounds) gives the driver its own
:class:`~shoal.training.loop.UnitLoop`, and one whose model lives elsewhere (the
parameter server) gives the step loop its collaborators.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from pydantic import BaseModel
from torch import nn

from shoal.checkpoint.changes import ResumeRules
from shoal.comm.links import CommGroup
from shoal.config.root import ShoalConfig
from shoal.errors import ConfigError
from shoal.runtime.context import WorkerContext
from shoal.runtime.roles import RankRoles
from shoal.tasks.base import Task
from shoal.tasks.registry import task_class
from shoal.training.contracts import GradientSync
from shoal.training.driver import Driver
from shoal.training.loop import UnitLoop
from shoal.training.steps import StepLoop

#: the strategies whose checkpoints are one learner's parts (`checkpoint/sharded.py`)
LEARNERS = ("local", "data_parallel", "tensor_parallel", "fully_sharded", "hybrid")


@dataclass(frozen=True)
class Shrink:
    """A job going on without one rank it gave up (`[faults] min_workers`)."""

    #: the `--set` items of the smaller job's config
    overrides: list[str]
    #: its membership, as the `membership` record in metrics.jsonl says it: {"workers": 2}
    members: dict[str, int]
    #: the floor that allowed it, for the log line: "faults.min_workers = 2"
    floor: str


class Strategy(ABC):
    """Base of every strategy; subclasses register under their config's `type`.

    A strategy is a plugin (`shoal.plugins`): shoal's own are listed in
    `plugins/kinds.py`, others come from a `shoal.strategies` entry point or a
    `[strategy] type = "custom"` dotted path. `config_class` is the pydantic model
    of its `[strategy]` table (of `[strategy.config]` under `type = "custom"`).
    """

    #: the pydantic model of this strategy's config section
    config_class: ClassVar[type[BaseModel]]

    #: True when the strategy can run inside the calling process (no worker processes)
    in_process: ClassVar[bool] = False

    #: the `[strategy]` field that `--workers N` sets (None: the strategy runs one process)
    workers_field: ClassVar[str | None] = None
    #: True when a job may go on with fewer workers than it started with, resumed from the
    #: same state, and still train the same problem (`[faults] min_workers`, recovery/)
    elastic: ClassVar[bool] = False

    #: `[strategy]` fields (patterns, e.g. "sharding.*") a resume may change freely: they
    #: change neither the problem nor the saved state's shape (the workers field is one)
    resume_safe: ClassVar[tuple[str, ...]] = ()
    #: `[strategy]` fields whose change the saved state cannot load into: always refused.
    #: Any field in neither list changes the problem and needs --allow-changes.
    resume_incompatible: ClassVar[tuple[str, ...]] = ()
    #: strategy types whose checkpoints this one resumes from: they keep the same parts, the
    #: model and optimizer by parameter name (the learner family loads each other's, sharded
    #: or not; pipeline saves in local's layout); empty: only its own type's
    resumes_from: ClassVar[tuple[str, ...]] = ()

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.roles = self.make_roles()

    def make_roles(self) -> RankRoles:
        """Which rank does what (`runtime/roles.py`); by default every rank trains."""
        return RankRoles.replicas(self.ctx.world_size)

    @classmethod
    def world_size(cls, config: ShoalConfig) -> int:
        """Worker processes the local launcher starts for this config."""
        return 1

    @classmethod
    def workers_override(cls, workers: int, section: str = "strategy") -> list[str]:
        """The `--set` items that make this strategy start `workers` worker processes
        (`section`: where its config lives, "strategy.config" under `type = "custom"`)."""
        if cls.workers_field is not None:
            return [f"{section}.{cls.workers_field}={workers}"]
        if workers == 1:
            return []
        name = cls.__name__.removesuffix("Strategy").lower()
        raise ConfigError(
            f"--workers {workers}: strategy '{name}' runs one process; set "
            '[strategy] type = "data_parallel" to train on several workers'
        )

    @classmethod
    def members(cls, config: ShoalConfig) -> dict[str, int]:
        """The job's membership by role ({"workers": N}; the parameter server adds its
        servers): what `[faults] min_workers` counts and `membership` records say."""
        return {"workers": cls.world_size(config)}

    @classmethod
    def workers_in(cls, config: ShoalConfig, world_size: int) -> int:
        """How many of `world_size` processes (as torchrun started them) are workers, in the
        terms a checkpoint's `world_size` counts them (the parameter server leaves out its
        dedicated servers)."""
        return world_size

    @classmethod
    def fit_world(cls, config: ShoalConfig, world_size: int, section: str) -> list[str]:
        """The `--set` items that make `config` describe `world_size` processes, as another
        launcher (torchrun, Slurm) started them: a host lost or back. [] (the default): the
        roles follow the world as it is (every rank a replica), or it already matches; a
        strategy whose config names its roles (the parameter server) overrides it."""
        return []

    @classmethod
    def without_rank(cls, config: ShoalConfig, rank: int, section: str) -> Shrink | None:
        """The job without `rank`, given up (`[faults] min_workers`, an `elastic` strategy):
        one worker fewer, the same global batch. None: that would go below the floor (the
        job restarts with every rank). `section`: where the strategy's config lives."""
        workers = cls.world_size(config) - 1
        floor = config.faults.min_workers
        if workers < floor:
            return None
        return Shrink(
            cls.workers_override(workers, section),
            {"workers": workers},
            f"faults.min_workers = {floor}",
        )

    @classmethod
    def describe_rank(cls, config: ShoalConfig, rank: int) -> str:
        """How the launcher's failure messages name `rank` (a pipeline adds its stage)."""
        return f"rank {rank}"

    @classmethod
    def restarts_alone(cls, config: ShoalConfig, rank: int) -> tuple[bool, str | None]:
        """Whether the launcher may restart `rank` alone when it dies, the others running on
        (a parameter server: strategies/parameter_server/rejoin.py), and a note for the log
        when a rank one might expect to be restarted alone is not (None: nothing to say)."""
        return False, None

    @classmethod
    def check(cls, config: ShoalConfig) -> None:
        """Checks across config sections that no single section can make; raise ConfigError."""
        return None

    @abstractmethod
    def attach(self, model: nn.Module) -> GradientSync:
        """Prepare `model` for training under this strategy and return its gradient sync."""

    def state_dict(self) -> dict[str, Any]:
        """Strategy state to checkpoint (e.g. compression residuals)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore what `state_dict` returned."""

    def describe(self) -> str:
        return self.ctx.config.strategy.type

    def run(self, task: Task) -> dict[str, Any]:
        """The job: by default the shared training loop."""
        return self.drive(task, StepLoop(self.ctx, task, self))

    def comm_group(self, backend: str | None = None) -> CommGroup:
        """Collective (every rank, in the same order): a private group for this strategy's
        messages, whose waits time out after `faults.timeout_s` (`comm/links.py`). `backend`:
        another than the job's (the parameter server's rows go over gloo, on the CPU)."""
        ctx = self.ctx
        device = ctx.comm_device if backend is None else torch.device("cpu")
        timeout_s = ctx.config.faults.timeout_s
        return CommGroup.create(ctx.rank, ctx.world_size, ctx.hosts, timeout_s, backend, device)

    def drive(self, task: Task, loop: UnitLoop, ctx: WorkerContext | None = None) -> dict[str, Any]:
        """Run `loop` under the one driver (`ctx`: this rank's, or a role's own context)."""
        rules = self.resume_rules(self.ctx.config)
        return Driver(ctx or self.ctx, task, loop, self.describe(), rules).run()

    @classmethod
    def resume_rules(cls, config: ShoalConfig) -> ResumeRules:
        """What a resume of `config` may change: the root rules, this strategy's lists, its
        worker count (a different count re-shards the work) and the task's lists."""
        # a plugin named by dotted path (type = "custom") keeps its settings one table down
        sections = {
            name: f"{name}.config" if getattr(config, name).type == "custom" else name
            for name in ("strategy", "task")
        }
        workers = (cls.workers_field,) if cls.workers_field is not None else ()
        task = task_class(config.task)
        return (
            ResumeRules(strategy_types=cls.resumes_from)
            .adding(sections["strategy"], cls.resume_safe + workers, cls.resume_incompatible)
            .adding(sections["task"], task.resume_safe, task.resume_incompatible)
        )
