"""The generation loop of population-based training.

Members are dealt round-robin to the workers (member m lives on rank m mod W)
and time-share them. A generation:

1. every worker trains each of its members for `ready_interval` steps, with the
   member's own data position and generators, and evaluates it on its own;
2. the workers exchange the results (a small JSON blob each, as uint8 tensors),
   so every worker knows every member's score;
3. every worker computes the same exploit and explore decisions from the scores
   and generators seeded by (seed, generation);
4. each loser receives its winner's weights, optimizer state and schedule (from
   its own worker's memory, or as tensors from the winner's worker), takes the
   explored hyperparameters into its live optimizer and model, and keeps its own
   data position;
5. every `checkpoint_every` generations rank 0 gathers every member's state and
   writes one checkpoint: a resume continues at that generation boundary exactly.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from shoal.checkpoint.manager import CheckpointManager
from shoal.errors import ConfigError, ShoalError
from shoal.monitor.metrics import MetricsLog
from shoal.monitor.progress import ProgressReporter
from shoal.runtime.collectives import gather_bytes
from shoal.runtime.context import WorkerContext
from shoal.runtime.roles import RankRoles
from shoal.runtime.stop import STOP, stop_record
from shoal.strategies.population.checkpoints import restore, save
from shoal.strategies.population.config import PopulationStrategyConfig
from shoal.strategies.population.lineage import Generation, MemberRecord
from shoal.strategies.population.member import GenerationStats, Member
from shoal.strategies.population.operators import (
    EXPLOIT_STREAM,
    EXPLOITS,
    EXPLORE_STREAM,
    EXPLORES,
    INIT_STREAM,
    Copy,
    fitness,
    stream,
)
from shoal.strategies.population.plot import PLOT_FILE, PlotFollower
from shoal.strategies.population.reporting import log_generation
from shoal.strategies.population.results import population_results
from shoal.strategies.population.space import Hyperparameters, sample_all
from shoal.strategies.population.transfer import recv_tree, send_tree
from shoal.tasks.base import Task
from shoal.training.batching import steps_per_epoch
from shoal.training.faults import InjectedFault, maybe_inject_fault


class PopulationFailed(RuntimeError):
    """Every member of the population failed in one generation: nothing is left to copy."""


def member_seed(seed: int, member: int) -> int:
    """Member `member`'s seed: its initialization, data order and training-time randomness."""
    return int(np.random.SeedSequence([seed, member]).generate_state(1)[0])


@contextmanager
def alone(task: Task) -> Iterator[None]:
    """Let `task` evaluate a model on this worker alone.

    `Task.evaluate` is collective: each rank scores its slice and the ranks sum.
    Here each worker scores its own members, which the other workers do not
    have, so the task sees a world of one while it does (its collectives then
    are the identity).
    """
    shared = task.ctx
    task.ctx = replace(shared, rank=0, world_size=1, backend=None, heartbeat=None)
    try:
        yield
    finally:
        task.ctx = shared


class PopulationTrainer:
    def __init__(
        self,
        ctx: WorkerContext,
        task: Task,
        config: PopulationStrategyConfig,
        roles: RankRoles,
        describe: str,
    ) -> None:
        self.ctx = ctx
        self.roles = roles
        self.task = task
        self.config = config
        self.describe = describe
        self.train = ctx.config.train
        self.size = config.population_size
        self.space = config.search_space
        self.metric, self.mode = resolve_metric(config, type(task))
        self.history: list[Generation] = []
        self.failures = 0
        self.replaced = 0
        self.samples = 0
        self.next_generation = 0
        # seconds: training steps and evaluation summed over all members (every worker's);
        # exchanges (results, exploit copies) and checkpoints as this worker spent them
        self.times = {"compute": 0.0, "evaluation": 0.0, "communication": 0.0, "checkpoint": 0.0}
        self.last_checkpoint: Path | None = None
        self.plot = PlotFollower(ctx.paths.root / PLOT_FILE, self.metric, self.space)
        self._fault_fired = False
        self.stopped: dict[str, Any] | None = None  # how a stop request ended the run

    # ------------------------------------------------------------ setup
    def owner(self, member: int) -> int:
        """The rank that holds member `member` (`runtime/roles.py`)."""
        return self.roles.owner(member)

    def _build(self) -> None:
        ctx, train, config = self.ctx, self.train, self.config
        if config.split not in self.task.eval_splits():
            raise ShoalError(
                f"strategy.split: task {ctx.config.task.type} has no split {config.split!r}; "
                f"it evaluates: {', '.join(self.task.eval_splits())}"
            )
        per_epoch = steps_per_epoch(self.task.train_size, train.batch_size, train.drop_last)
        if per_epoch == 0:
            raise ShoalError(
                f"train.batch_size ({train.batch_size}) exceeds the {self.task.train_size} "
                "training samples and drop_last = true: no step would run"
            )
        limits = [train.max_steps or math.inf, (train.epochs or math.inf) * per_epoch]
        if config.generations is not None:
            limits.append(config.generations * config.ready_interval)
        self.total_steps = int(min(limits))
        self.generations = math.ceil(self.total_steps / config.ready_interval)
        self.hyper: list[Hyperparameters] = [
            sample_all(self.space, stream(train.seed, INIT_STREAM, m)) for m in range(self.size)
        ]
        self.parents: list[int | None] = [None] * self.size
        self.members: dict[int, Member] = {}
        for m in range(self.size):
            if self.owner(m) == ctx.rank:
                taken = [member.model for member in self.members.values()]
                seed = member_seed(train.seed, m)
                self.members[m] = Member(ctx, self.task, m, seed, self.total_steps, taken)
                self.members[m].set_hyperparameters(self.hyper[m])
        self.checkpoints = CheckpointManager(ctx, ctx.config.checkpoint.keep_last)
        if ctx.resume_from:
            restore(self, Path(ctx.resume_from))

    # ------------------------------------------------------------ the loop
    def fit(self) -> dict[str, Any]:
        started = time.perf_counter()
        self._build()
        ctx = self.ctx
        self.metrics = MetricsLog(ctx.paths.metrics, enabled=ctx.is_main)
        self.reporter = ProgressReporter(
            ctx.config.monitor.progress, ctx.is_main, self.total_steps, None
        )
        ctx.log.info(
            "population-based training with %s: %d members (%s here), %d generations of %d "
            "steps, %d steps per member",
            self.describe,
            self.size,
            ", ".join(map(str, self.members)),
            self.generations,
            self.config.ready_interval,
            self.total_steps,
        )
        if ctx.resume_from:  # lines of later generations before this one are of the lost attempt
            self.metrics.write(
                {
                    "event": "resume",
                    "generation": self.next_generation,
                    "step": self.history[-1].end if self.history else 0,
                    "checkpoint": ctx.resume_from,
                }
            )
        self.reporter.start(self.next_generation * self.config.ready_interval)
        try:
            every = self.config.checkpoint_every
            for g in range(self.next_generation, self.generations):
                self._generation(g)
                last = g + 1 == self.generations
                signum = STOP.agree(ctx)  # at the generation boundary, alike on every worker
                if (
                    signum
                    or (every and (g + 1) % every == 0)
                    or (last and ctx.config.checkpoint.at_end)
                ):
                    save(self)
                if signum:
                    self._stop(signum)
                    break
        finally:
            self.reporter.close()
            self.metrics.close()
        return population_results(self, time.perf_counter() - started)

    def _stop(self, signum: int) -> None:
        step = self.history[-1].end
        checkpoint = str(self.last_checkpoint) if self.last_checkpoint else None
        self.stopped = stop_record(signum, step, checkpoint)
        self.metrics.write({"event": "stopped", "generation": self.next_generation, **self.stopped})
        self.ctx.log.info(
            "stopped by %s after generation %d", self.stopped["signal"], self.next_generation
        )

    def _generation(self, g: int) -> None:
        start = g * self.config.ready_interval
        steps = min(self.config.ready_interval, self.total_steps - start)
        local: dict[int, GenerationStats] = {}
        for m, member in self.members.items():
            stats = member.train(steps, self._before_step)
            if stats.error is None:
                stats.metrics, stats.eval_s = self._evaluate(member)
            local[m] = stats
            self.ctx.log.info(
                "generation %d member %d: %s", g, m, stats.error or f"{stats.metrics}"
            )
        exchange_started = time.perf_counter()
        everyone = self._exchange(local)
        self.times["communication"] += time.perf_counter() - exchange_started
        scores = [self._score(everyone[m]) for m in range(self.size)]
        records = [
            MemberRecord(
                dict(self.hyper[m]),
                scores[m],
                self.parents[m],
                everyone[m].loss,
                everyone[m].error,
                everyone[m].metrics,
            )
            for m in range(self.size)
        ]
        generation = Generation(g, start, start + steps, records)
        self.history.append(generation)
        for stats in everyone.values():
            self.times["compute"] += stats.compute_s
            self.times["evaluation"] += stats.eval_s
            self.samples += stats.samples
            self.failures += stats.error is not None
        log_generation(self, generation, everyone)
        if g + 1 < self.generations:
            self._evolve(g, scores, start + steps)
        self.next_generation = g + 1

    def _before_step(self, step: int) -> None:
        if self.ctx.heartbeat is not None:
            self.ctx.heartbeat.beat(step)
        if not self._fault_fired:
            try:
                maybe_inject_fault(self.ctx, step)
            except InjectedFault:
                self._fault_fired = True  # one member fails, not every member reaching the step
                raise

    def _evaluate(self, member: Member) -> tuple[dict[str, float], float]:
        started = time.perf_counter()
        with alone(self.task):
            metrics = self.task.evaluate(member.model, self.config.split)
        if self.metric not in metrics:
            raise ShoalError(
                f"strategy.metric: {self.metric!r} is not measured by task "
                f"{self.ctx.config.task.type} on split {self.config.split!r}; it reports: "
                f"{', '.join(sorted(metrics))}"
            )
        return metrics, time.perf_counter() - started

    def _score(self, stats: GenerationStats) -> float:
        if stats.error is not None:
            return math.nan
        return float(stats.metrics[self.metric])

    def _exchange(self, local: dict[int, GenerationStats]) -> dict[int, GenerationStats]:
        """Every worker's results for its members, on every worker (JSON in uint8 tensors)."""
        blob = json.dumps({str(m): asdict(s) for m, s in local.items()}).encode()
        everyone: dict[int, GenerationStats] = {}
        for part in gather_bytes(self.ctx, blob):
            for m, stats in json.loads(part.decode()).items():
                everyone[int(m)] = GenerationStats(**stats)
        return everyone

    # ------------------------------------------------------------ exploit and explore
    def _evolve(self, g: int, scores: list[float], step: int) -> None:
        started = time.perf_counter()
        fit = fitness(scores, self.mode)
        failed = [m for m in range(self.size) if math.isnan(fit[m])]
        if len(failed) == self.size:
            raise PopulationFailed(
                f"every member of the population failed in generation {g}; first: "
                f"member 0: {self.history[-1].members[0].error}"
            )
        seed = self.train.seed
        exploit = EXPLOITS.get(self.config.exploit.method)
        explore = EXPLORES.get(self.config.explore.method)
        copies = exploit(fit, self.config.exploit, stream(seed, EXPLOIT_STREAM, g))
        self._copy_states(copies)
        self.parents = [None] * self.size
        for c in copies:
            new = explore(
                self.hyper[c.winner],
                self.space,
                self.config.explore,
                stream(seed, EXPLORE_STREAM, g, c.loser),
            )
            self.metrics.write(
                {
                    "event": "exploit",
                    "generation": g,
                    "step": step,
                    "member": c.loser,
                    "parent": c.winner,
                    "reason": "failed" if c.loser in failed else "exploit",
                    "hyperparameters": new,
                    "parent_hyperparameters": self.hyper[c.winner],
                }
            )
            self.hyper[c.loser] = new
            self.parents[c.loser] = c.winner
            if c.loser in self.members:
                self.members[c.loser].set_hyperparameters(new)
        self.replaced += len(copies)
        self.times["communication"] += time.perf_counter() - started

    def _copy_states(self, copies: list[Copy]) -> None:
        """Each loser takes its winner's weights, optimizer state and schedule.

        Winners are snapshotted first: a winner may itself lose to another member
        (binary tournament), and its copies must be of its state at the end of
        the generation. Every rank walks the copies in the same order, so each
        send meets its receive.
        """
        rank = self.ctx.rank
        snapshots = {
            c.winner: copy.deepcopy(self.members[c.winner].exploit_state())
            for c in copies
            if self.owner(c.winner) == rank
        }
        for c in copies:
            src, dst = self.owner(c.winner), self.owner(c.loser)
            what = f"member {c.winner}'s state for member {c.loser}"
            if src == rank and dst == rank:
                self.members[c.loser].load_exploit_state(copy.deepcopy(snapshots[c.winner]))
            elif src == rank:
                send_tree(self.ctx, snapshots[c.winner], dst, what)
            elif dst == rank:
                self.members[c.loser].load_exploit_state(recv_tree(self.ctx, src, what))


def resolve_metric(config: PopulationStrategyConfig, task_class: type[Task]) -> tuple[str, str]:
    """The metric that ranks members and its direction: the config's, else the task's."""
    primary, direction = task_class.primary_metric
    metric = config.metric or primary
    if config.mode is not None:
        return metric, config.mode
    if metric == primary:
        return metric, direction
    if metric == "loss":
        return metric, "min"
    raise ConfigError(
        f'strategy.mode: required with metric = {metric!r}: set mode = "max" if a higher '
        f'{metric} is better, else mode = "min"'
    )
