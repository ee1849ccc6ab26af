"""The generation loop of population-based training, run by the one driver.

Members are dealt round-robin to the workers (member m lives on rank m mod W,
`runtime/roles.py`) and time-share them. A generation is the loop's unit
(`training/loop.py`):

1. every worker trains each of its members for `ready_interval` steps, with the
   member's own data position and generators, and evaluates it on its own;
2. the workers exchange the results (a small JSON blob each, as uint8 tensors),
   so every worker knows every member's score;
3. every worker computes the same exploit and explore decisions from the scores
   and generators seeded by (seed, generation);
4. each loser receives its winner's weights, optimizer state and schedule (from
   its own worker's memory, or as tensors from the winner's worker), takes the
   explored hyperparameters into its live optimizer and model, and keeps its own
   data position.

The driver does the rest, as for every strategy: progress counts training
steps (`progress.global_step` is the members' step; a generation is
`ready_interval` of them), a checkpoint every `strategy.checkpoint_every`
generations (every member's state and the book: `parts.py`; a resume continues
at that generation boundary exactly), stop requests at generation boundaries,
model selection on the best member's figures (by `strategy.metric` / `mode` on
`strategy.split`), the test splits and artifacts with the best member
(`record.py`), and results.json with this loop's section.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from shoal.checkpoint.parts import Custom, RankRngs, StatePart
from shoal.comm.codec import recv_tree, send_tree
from shoal.comm.links import CommGroup
from shoal.errors import ShoalError
from shoal.runtime.collectives import gather_bytes
from shoal.runtime.rng import seed_everything
from shoal.shape.roles import RankRoles
from shoal.strategies.population.config import PopulationStrategyConfig
from shoal.strategies.population.knobs import resolve_metric
from shoal.strategies.population.lineage import Generation, MemberRecord, schedule
from shoal.strategies.population.member import GenerationStats, Member
from shoal.strategies.population.operators import (
    EXPLOIT_STREAM,
    EXPLOITS,
    EXPLORE_STREAM,
    EXPLORES,
    INIT_STREAM,
    Copy,
    ExploitFn,
    ExploreFn,
    fitness,
    stream,
)
from shoal.strategies.population.parts import BookPart, Members, PopulationBook
from shoal.strategies.population.plot import PLOT_FILE, PlotFollower
from shoal.strategies.population.record import BestMember, best_member
from shoal.strategies.population.reporting import GenerationReport
from shoal.strategies.population.schedule import MemberScheduler
from shoal.strategies.population.space import sample_population
from shoal.training.batching import steps_per_epoch
from shoal.training.faults import InjectedFault, maybe_inject_fault
from shoal.training.loop import ModelOfRecord, Plan, Run, UnitLoop
from shoal.training.meter import PHASES, RankPhases

#: a generation's per-worker phases: its members' steps' (the step loop's), their
#: evaluation, and the rest of the generation
GENERATION_PHASES = (*PHASES.values(), "eval_s", "other_s")


class PopulationFailed(RuntimeError):
    """Every member of the population failed in one generation: nothing is left to copy."""


def member_seed(seed: int, member: int) -> int:
    """Member `member`'s seed: its initialization, data order and training-time randomness."""
    return int(np.random.SeedSequence([seed, member]).generate_state(1)[0])


class PopulationLoop(UnitLoop):
    """The generation loop on one worker: its members, the population's book."""

    def __init__(
        self,
        run: Run,
        config: PopulationStrategyConfig,
        roles: RankRoles,
        peers: CommGroup,
        describe: str,
    ) -> None:
        """`peers`: the group members' states travel on (exploit copies, checkpoints)."""
        super().__init__(run)
        ctx, task = self.ctx, self.task
        self.roles, self.config = roles, config
        self.peers = peers
        self.describe, self.train = describe, ctx.config.train
        # each worker scores its own members, which the others do not have: the task's
        # evaluation (collective) runs among the ranks of a world of one
        solo = replace(ctx, rank=0, world_size=1, backend=None, heartbeat=None, group=None)
        self.alone = task.on(solo)
        self.size = config.population_size
        self.space = config.search_space
        self.metric, self.mode = resolve_metric(config, task.primary_metric)
        self.plot = PlotFollower(ctx.paths.root / PLOT_FILE, self.metric, self.space)
        self._fault_fired = False
        self._sent_mark = 0  # this rank's bytes sent to peers until the last generation
        self._undo_fault: Callable[[], None] = lambda: None
        dynamic = config.balance == "dynamic" and ctx.world_size > 1
        self.scheduler = MemberScheduler(ctx.world_size) if dynamic else None
        self._members_part: Members | None = None
        self._last_generation = time.perf_counter()
        train = self.train
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
        self.book = PopulationBook(
            sample_population(self.space, self.size, stream(train.seed, INIT_STREAM))
        )
        self.members: dict[int, Member] = {}
        for m in range(self.size):
            if self.roles.owner(m) == ctx.rank:
                taken = [member.model for member in self.members.values()]
                seed = member_seed(train.seed, m)
                self.members[m] = Member(ctx, self.task, m, seed, self.total_steps, taken)
                self.members[m].set_hyperparameters(self.book.hyper[m])
        seed_everything(train.seed)  # the testing model: its weights come from a member
        tested = self.task.build_model().to(ctx.device)
        self.record = BestMember(ctx, self.peers, self.roles, tested, self.members)
        self.report = GenerationReport(
            run, self.roles, self.metric, self.mode, config.split, self.generations
        )
        self.plan = Plan(
            unit="generation",
            total=self.total_steps,
            line=(
                f"population-based training with {self.describe}: {self.size} members "
                f"({', '.join(map(str, self.members))} here), {self.generations} generations "
                f"of {config.ready_interval} steps, {self.total_steps} steps per member"
            ),
            eval_every=1,
            steps_per_unit=config.ready_interval,
            checkpoint_every=config.checkpoint_every,
            selection=(config.split, self.metric, self.mode),
            optional_parts=("placement",),  # older checkpoints lack it
        )

    def state_parts(self) -> dict[str, StatePart]:
        """The book first: the members take their hyperparameters from it. Each member
        carries its own generators, so a resume on another number of workers draws as an
        uninterrupted run does: the workers' own generators need no reseeding."""
        members = Members(self.ctx, self.peers, self.roles, self.members, self.book, self.run)
        self._members_part = members  # its placement follows the scheduler's
        return {
            "population": BookPart(self.book, self.record),
            "placement": Custom(self._placement_state, self._load_placement),
            "members": members,
            "rng": RankRngs(self.ctx),
        }

    def after_restore(self) -> None:
        """Lines of later generations before this one are of the lost attempt: say where
        this one resumed."""
        self.progress.global_step = self.book.history[-1].end if self.book.history else 0
        self.run.metrics.write(
            {
                "event": "resume",
                "generation": self.book.next_generation,
                "step": self.progress.global_step,
                "checkpoint": self.ctx.resume_from,
            }
        )

    def model_of_record(self) -> ModelOfRecord:
        return self.record

    def validation(self) -> dict[str, dict[str, float]]:
        """The best member's figures of the latest generation, measured by its worker."""
        generation = self.book.history[-1]
        self.record.current = best_member(generation, self.mode)
        return {self.config.split: dict(generation.members[self.record.current].metrics)}

    # ------------------------------------------------------------ the units
    def start(self) -> None:
        """Each member trains in its own learner: only the generations' clock starts."""
        self._last_generation = time.perf_counter()

    def done(self) -> bool:
        return self.book.next_generation >= self.generations

    def run_unit(self) -> bool:
        self._generation(self.book.next_generation)
        self.progress.global_step = self.book.history[-1].end
        if self.ctx.is_main:
            self.plot.follow(self.book.history)
        return False

    def flush(self) -> None:
        """Every generation is recorded as it ends; a run in which no validation selected a
        best member tests the latest best one."""
        if self.book.history:
            self.record.take_latest()

    # ------------------------------------------------------------ a generation
    def _generation(self, g: int) -> None:
        """Train and evaluate this worker's members, exchange the scores, exploit and
        explore. Each worker times its generation in the step loop's phases (`RankPhases`):
        its members' steps, their evaluation (`eval`), the exchange, the exploit copies and
        member moves (`communication wait`), the rest (`other`)."""
        began = time.perf_counter()
        start = g * self.config.ready_interval
        steps = min(self.config.ready_interval, self.total_steps - start)
        local: dict[int, GenerationStats] = {}
        phases = RankPhases(GENERATION_PHASES)
        for m, member in self.members.items():
            try:
                stats = member.train(steps, self._before_step, phases)
            finally:
                self._undo_fault()  # a slowed rank computes slowly while it trains, only
            if stats.error is None:
                stats.metrics, stats.eval_s = self._evaluate(member)
                phases.add("eval_s", stats.eval_s)
            local[m] = stats
            self.ctx.log.info(
                "generation %d member %d: %s", g, m, stats.error or f"{stats.metrics}"
            )
        exchange_started = time.perf_counter()
        everyone = self._exchange(local)
        self.book.times["communication"] += time.perf_counter() - exchange_started
        phases.add("comm_s", time.perf_counter() - exchange_started)
        scores = [self._score(everyone[m]) for m in range(self.size)]
        records = [
            MemberRecord(
                dict(self.book.hyper[m]),
                scores[m],
                self.book.parents[m],
                everyone[m].loss,
                everyone[m].error,
                everyone[m].metrics,
            )
            for m in range(self.size)
        ]
        generation = Generation(g, start, start + steps, records)
        self.book.history.append(generation)
        for stats in everyone.values():
            self.book.times["compute"] += stats.compute_s
            self.book.times["evaluation"] += stats.eval_s
            self.book.samples += stats.samples
            self.book.failures += stats.error is not None
        self.report.members(generation)
        best = generation.members[best_member(generation, self.mode)]
        self.run.logged_train({"loss": best.train_loss}, start + steps)
        if g + 1 < self.generations:
            evolving = time.perf_counter()
            self._evolve(g, scores, start + steps)
            if self.scheduler is not None:
                self._reschedule(g, everyone)
            phases.add("comm_s", time.perf_counter() - evolving)
        sent, self._sent_mark = self.peers.sent_bytes - self._sent_mark, self.peers.sent_bytes
        now = time.perf_counter()
        seconds = now - self._last_generation  # with the driver's validation, checkpoints
        phases.add("other_s", max(now - began - phases.total, 0.0))
        figures = phases.reduce(self.ctx)
        self._last_generation = now
        self.report.summary(
            generation, everyone, self.members, sent / max(steps, 1), seconds, figures
        )
        self.book.next_generation = g + 1

    def _reschedule(self, g: int, everyone: dict[int, GenerationStats]) -> None:
        """`balance = "dynamic"`: re-place the members by the workers' measured speeds (the
        same decision on every worker), moving each one that changes worker with its state."""
        assert self.scheduler is not None
        self.scheduler.observe(self.roles, everyone)
        placement = self.scheduler.placement(self.roles)
        if placement is None:
            return
        started = time.perf_counter()
        roles, rank, ctx = self.roles.placed(placement), self.ctx.rank, self.ctx
        moves = [m for m in range(self.size) if roles.owner(m) != self.roles.owner(m)]
        for m in moves:
            src, dst = self.roles.owner(m), roles.owner(m)
            what = f"member {m}'s state (moving to rank {dst})"
            if src == rank:
                send_tree(self.peers, self.members.pop(m).state_dict(), dst, what)
            elif dst == rank:
                state = recv_tree(self.peers, src, what, ctx.device, f"member {m}'s host")
                taken = [member.model for member in self.members.values()]
                seed = member_seed(self.train.seed, m)
                member = Member(ctx, self.task, m, seed, self.total_steps, taken)
                member.load_state_dict(state)
                member.set_hyperparameters(self.book.hyper[m])
                self.members[m] = member
        self._adopt(roles)
        self.book.times["communication"] += time.perf_counter() - started
        speeds = self.scheduler.speeds or []
        ctx.log.info("generation %d: members moved %s; %s", g, moves, roles.describe())
        self.run.metrics.write(
            {
                "event": "schedule",
                "generation": g,
                "step": self.book.history[-1].end,
                "moved": moves,
                "members_by_rank": {r: roles.hosted_by(r) for r in roles.workers},
                "steps_per_s": speeds,
            }
        )

    def _placement_state(self) -> dict[str, Any]:
        """Each member's worker index and the workers' smoothed speeds (dynamic placement)."""
        roles = self.roles
        placement = [roles.workers.index(roles.owner(m)) for m in range(self.size)]
        speeds = self.scheduler.speeds if self.scheduler is not None else None
        return {"placement": placement, "speeds": speeds}

    def _load_placement(self, state: dict[str, Any]) -> None:
        """Under dynamic placement, on as many workers: the members go where the checkpoint
        had them (before their states load) and the speeds are the saved ones; otherwise the
        placement starts afresh."""
        placement, speeds = state.get("placement"), state.get("speeds")
        workers = len(self.roles.workers)
        if self.scheduler is None or speeds is None or len(speeds) != workers:
            return
        if not isinstance(placement, list) or len(placement) != self.size:
            return
        self.scheduler.speeds = [float(v) for v in speeds]
        roles = self.roles.placed([int(w) for w in placement])
        ctx = self.ctx
        for m in [m for m in self.members if roles.owner(m) != ctx.rank]:
            del self.members[m]
        for m in roles.hosted_by(ctx.rank):
            if m not in self.members:  # its state comes with the members part, next
                taken = [member.model for member in self.members.values()]
                seed = member_seed(self.train.seed, m)
                self.members[m] = Member(ctx, self.task, m, seed, self.total_steps, taken)
        self._adopt(roles)
        ctx.log.info("members placed as the checkpoint had them: %s", roles.describe())

    def _adopt(self, roles: RankRoles) -> None:
        """`roles` is where the members are from now on, for every part that asks."""
        self.roles = self.record.roles = self.report.roles = roles
        if self._members_part is not None:
            self._members_part.roles = roles

    def _before_step(self, step: int) -> None:
        if self.ctx.heartbeat is not None:
            self.ctx.heartbeat.beat(step)
        if not self._fault_fired:
            try:
                self._undo_fault = maybe_inject_fault(self.ctx, step)
            except InjectedFault:
                self._fault_fired = True  # one member fails, not every member reaching the step
                raise

    def _evaluate(self, member: Member) -> tuple[dict[str, float], float]:
        started = time.perf_counter()
        metrics = self.alone.evaluate(member.model, self.config.split)
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
                f"member 0: {self.book.history[-1].members[0].error}"
            )
        seed = self.train.seed
        exploit: ExploitFn = EXPLOITS.load(self.config.exploit.method)
        explore: ExploreFn = EXPLORES.load(self.config.explore.method)
        copies = exploit(fit, self.config.exploit, stream(seed, EXPLOIT_STREAM, g))
        self._copy_states(copies)
        self.book.parents = [None] * self.size
        for c in copies:
            new = explore(
                self.book.hyper[c.winner],
                self.space,
                self.config.explore,
                stream(seed, EXPLORE_STREAM, g, c.loser),
            )
            self.run.metrics.write(
                {
                    "event": "exploit",
                    "generation": g,
                    "step": step,
                    "member": c.loser,
                    "parent": c.winner,
                    "reason": "failed" if c.loser in failed else "exploit",
                    "hyperparameters": new,
                    "parent_hyperparameters": self.book.hyper[c.winner],
                }
            )
            self.book.hyper[c.loser] = new
            self.book.parents[c.loser] = c.winner
            if c.loser in self.members:
                self.members[c.loser].set_hyperparameters(new)
        self.book.replaced += len(copies)
        self.book.times["communication"] += time.perf_counter() - started

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
            if self.roles.owner(c.winner) == rank
        }
        for c in copies:
            src, dst = self.roles.owner(c.winner), self.roles.owner(c.loser)
            what = f"member {c.winner}'s state for member {c.loser}"
            if src == rank and dst == rank:
                self.members[c.loser].load_exploit_state(copy.deepcopy(snapshots[c.winner]))
            elif src == rank:
                send_tree(self.peers, snapshots[c.winner], dst, what, f"member {c.loser}'s host")
            elif dst == rank:
                role = f"member {c.winner}'s host"
                state = recv_tree(self.peers, src, what, self.ctx.device, role)
                self.members[c.loser].load_exploit_state(state)

    # ------------------------------------------------------------ results
    def section(self) -> dict[str, Any]:
        """The population's results.json fields: the final population's best member, its
        schedule, every member; rank 0 draws the plot."""
        history = self.book.history
        if not history:
            return {"population_size": self.size, "generations": 0}
        last = history[-1]
        best = best_member(last, self.mode)
        record = last.members[best]
        samples, compute_s = self.book.samples, self.book.times["compute"]
        if self.ctx.is_main:
            self.plot.write(history)
        return {
            "population_size": self.size,
            "generations": len(history),
            "steps": last.end,
            "samples": samples,
            "samples_per_s": samples / compute_s if compute_s else 0.0,
            "time_s": dict(self.book.times),
            "metric": self.metric,
            "mode": self.mode,
            "best": {
                "member": best,
                "score": record.score,
                "hyperparameters": record.hyperparameters,
                "schedule": schedule(history, best),
            },
            "population": [
                {
                    "member": m,
                    "score": r.score,
                    "hyperparameters": r.hyperparameters,
                    "parent": r.parent,
                    "status": "failed" if r.error else "ok",
                }
                for m, r in enumerate(last.members)
            ],
            "failures": self.book.failures,
            "replaced": self.book.replaced,
            "plot": str(self.plot.path),
        }
