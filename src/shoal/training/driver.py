"""The driver: runs any :class:`~shoal.training.loop.UnitLoop` and owns everything around it.

See `loop.py` for the protocol and the order of things after each unit. The
driver keeps the run's :class:`~shoal.training.state.TrainProgress` (the
loop's position in `global_step`, model selection, totals; saved as the
checkpoint part `progress`), writes metrics.jsonl and results.json, shows
progress, beats the heartbeat, answers stop requests, evaluates, keeps the
best model and checkpoints.

A stop request (SIGTERM, SIGINT; `runtime/stop.py`) ends the loop at a unit
boundary every rank agreed on: the driver writes a checkpoint there, skips the
remaining evaluation and testing, and reports `"status": "stopped"`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from shoal.checkpoint.atomic import atomic_write_json
from shoal.checkpoint.changes import resume_rules
from shoal.checkpoint.manager import CheckpointManager
from shoal.checkpoint.parts import FilePart, Fixed, RankRngs, StatePart, TaskFiles, load_parts
from shoal.checkpoint.resume import open_resume
from shoal.checkpoint.space import DiskFull
from shoal.config import dump_config
from shoal.monitor.metrics import MetricsLog
from shoal.monitor.progress import ProgressReporter
from shoal.protocols.task import Task
from shoal.recovery.replicas import host_snapshot_dir, send_replica
from shoal.recovery.snapshots import snapshot_dir
from shoal.runtime.collectives import all_reduce_sum
from shoal.runtime.context import WorkerContext
from shoal.runtime.memory import peak_memory_bytes
from shoal.runtime.stop import STOP, stop_record
from shoal.training.evaluation import evaluate_splits
from shoal.training.loop import Plan, Run, UnitLoop
from shoal.training.selection import Selection
from shoal.training.state import TrainProgress

#: builds a strategy's loop with what the driver gives it (`Run`)
LoopFactory = Callable[[Run], UnitLoop]


class Driver:
    loop: UnitLoop  # built by `run`

    def __init__(self, ctx: WorkerContext, task: Task, make_loop: LoopFactory, detail: str) -> None:
        """`make_loop`: the strategy's loop, built once the driver's records exist;
        `detail`: the strategy as logged."""
        self.ctx, self.task, self.make_loop, self.detail = ctx, task, make_loop, detail
        self.rules = resume_rules(ctx.config)  # what a resume may change (its fields say)
        self.progress = TrainProgress()
        self.last_eval: dict[str, dict[str, float]] = {}
        self.last_checkpoint: Path | None = None
        self.stopped: dict[str, Any] | None = None
        self._saved_step = -1
        self._evaluated_step = -1

    # ---------------------------------------------------------------- the run
    def run(self) -> dict[str, Any]:
        started = time.perf_counter()
        ctx = self.ctx
        board = ctx.paths.tensorboard if ctx.config.monitor.tensorboard else None
        self.metrics = MetricsLog(ctx.paths.metrics, enabled=ctx.is_main, tensorboard=board)
        self.reporter = ProgressReporter(ctx.config.monitor.progress, ctx.is_main, 0, None)
        self.run_info = Run(ctx, self.task, self.progress, self.metrics, self.reporter, {})
        loop: UnitLoop | None = None
        try:
            loop = self.loop = self.make_loop(self.run_info)
            self.plan = loop.plan
            self.reporter.total_steps, self.reporter.total_epochs = plan_totals(self.plan)
            self.checkpoints = CheckpointManager(ctx, ctx.config.checkpoint.keep_last)
            self.snapshots = _snapshots(ctx)
            self.selection = Selection(
                ctx,
                self.task,
                self.progress,
                self.loop.model_of_record(),
                self._save_best,
                self.plan.selection,
            )
            if ctx.resume_from:
                self._restore(Path(ctx.resume_from))
            ctx.log.info("%s", self.plan.line)
            self._session_start = time.perf_counter()
            self._time_base = self.progress.train_time_s
            self.reporter.start(self.progress.global_step)
            self.loop.start()
            if ctx.heartbeat is not None:
                ctx.heartbeat.state = "training"
            self._loop()
            if self.stopped is None:
                with self._doing("evaluating"):
                    self._test_and_save_artifacts()
        finally:
            self.reporter.close()
            self.metrics.close()
            if loop is not None:
                loop.close()
        return self._finish(time.perf_counter() - started)

    def _loop(self) -> None:
        ctx, p, plan = self.ctx, self.progress, self.plan
        every_units = plan.checkpoint_every
        if every_units is None:
            every_units = ctx.config.checkpoint.every_steps
        every_epochs = ctx.config.checkpoint.every_epochs
        eval_epochs = ctx.config.train.eval_every_epochs
        per_unit = plan.steps_per_unit
        first = True  # the first unit is reported at once (a restart's recovery ends there)
        while not (p.stopped_early or self.loop.done()):
            epoch_ended = self.loop.run_unit()
            self._sync_time()
            if ctx.heartbeat is not None:
                ctx.heartbeat.beat(p.global_step, now=first)
                first = False
            signum = self.loop.agree_stop()
            if signum:  # before the epoch's end: a resume then does what this run skips
                self._stop(signum)
                return
            units = p.global_step if per_unit == 1 else -(-p.global_step // per_unit)
            if plan.eval_every and units % plan.eval_every == 0:
                self._evaluate()
            if every_units and units % every_units == 0:
                self._boundary()
                self._save()
            if self.snapshots is not None and units % self.snapshots[1] == 0:
                self._snapshot(self.snapshots[0])
            if epoch_ended:
                self.loop.next_epoch()
                if eval_epochs and p.epoch % eval_epochs == 0:
                    self._evaluate()
                if every_epochs and p.epoch % every_epochs == 0:
                    self._boundary()
                    self._save()
        self.loop.flush()
        signum = STOP.agree(ctx)  # a request that came after the last unit's agreement
        if signum:
            self._stop(signum)
            return
        if self._evaluated_step != p.global_step:
            self._evaluate()
        if ctx.config.checkpoint.at_end and self._saved_step != p.global_step:
            self._save()

    def _stop(self, signum: int) -> None:
        """Every rank, at the same unit: record what is pending, write a checkpoint, record it."""
        p = self.progress
        self.loop.flush()
        if self._saved_step != p.global_step:
            self._save()
        checkpoint = str(self.last_checkpoint) if self._saved_step == p.global_step else None
        self.stopped = stop_record(signum, p.global_step, checkpoint)
        self.metrics.write({"event": "stopped", **self.stopped})
        unit = self.plan.unit
        self.reporter.note(f"stopped by {self.stopped['signal']} at {unit} {p.global_step}")
        self.ctx.log.info("stopped by %s at %s %d", self.stopped["signal"], unit, p.global_step)

    @contextlib.contextmanager
    def _doing(self, state: str) -> Iterator[None]:
        """What the heartbeat reports while the block runs (`shoal status`)."""
        if self.ctx.heartbeat is None:
            yield
            return
        with self.ctx.heartbeat.doing(state):
            yield

    # ---------------------------------------------------------------- evaluation
    def _evaluate(self) -> None:
        with self._doing("evaluating"):
            self._evaluate_now()

    def _evaluate_now(self) -> None:
        p = self.progress
        measured = self.loop.validation()
        if measured is not None:  # measured by the loop (a population's members)
            self.last_eval.update(measured)
        else:
            evaluate_splits(
                self.task,
                self.selection.record.model,
                self.task.eval_splits(),
                event={"event": "eval", "step": p.global_step, "epoch": p.epoch},
                label=f"{self.plan.unit} {p.global_step} epoch {p.epoch}",
                metrics=self.metrics,
                reporter=self.reporter,
                log=self.ctx.log,
                into=self.last_eval,
            )
        self._evaluated_step = p.global_step
        if self.selection.track(self.last_eval):
            self.reporter.note(self.selection.message)
            self.ctx.log.info("%s", self.selection.message)
        self._observe_for_schedule()

    def _observe_for_schedule(self) -> None:
        """Hand the validation value of the primary metric to the loop's schedule
        (lr_decay = "plateau" lowers the rate on it)."""
        split, name, direction = self.selection.criterion
        value = self.last_eval.get(split, {}).get(name) if split else None
        if value is not None:
            self.loop.observe_metric(value, direction)

    def _test_and_save_artifacts(self) -> None:
        """Put the best model in place, evaluate the test splits with it, save artifacts."""
        step = self.selection.restore_best()
        model = self.selection.record.model
        evaluate_splits(
            self.task,
            model,
            self.task.test_splits(),
            event={"event": "test", "model_step": step},
            label=f"model of {self.plan.unit} {step},",
            metrics=self.metrics,
            reporter=self.reporter,
            log=self.ctx.log,
            into=self.last_eval,
        )
        self.task.save_artifacts(model)

    # ---------------------------------------------------------------- checkpoints
    def _parts(self) -> dict[str, StatePart]:
        """The loop's parts, then the driver's (a loop may bring its own `rng`)."""
        parts = {
            **self.loop.state_parts(),
            "progress": self.progress,
            "config": Fixed(dump_config(self.ctx.config)),
        }
        parts.setdefault("rng", RankRngs(self.ctx, reseed=lambda: self.progress.global_step))
        return parts

    def _files(self) -> list[FilePart]:
        """The task's files (first) and the loop's, written into every checkpoint folder."""
        return [TaskFiles(self.task.checkpoint_files), *self.loop.file_parts()]

    def _sync_time(self) -> None:
        self.progress.train_time_s = self._time_base + time.perf_counter() - self._session_start

    def _meta(self) -> dict[str, Any]:
        """meta.json's description of the position; `loss` is the latest logged training
        loss, of the step `loss_step` (the checkpoint's own step when it is a logged one)."""
        p = self.progress
        meta: dict[str, Any] = {
            "epoch": p.epoch,
            "step_in_epoch": p.step_in_epoch,
            "unit": self.plan.unit,
            "train_size": self.task.train_size,
        }
        logged = self.run_info.last_train
        if "loss" in logged:
            meta["loss"], meta["loss_step"] = logged["loss"], self.run_info.last_train_step
        return meta

    def _boundary(self) -> None:
        """Collective: the loop's work before a periodic checkpoint (once a position, and
        only while units remain)."""
        p = self.progress
        if self._saved_step == p.global_step or self.loop.done():
            return
        self.loop.before_checkpoint()

    def _save(self) -> None:
        """Collective: a periodic checkpoint (once per position)."""
        p = self.progress
        if self._saved_step == p.global_step:
            return  # e.g. every_steps and every_epochs at the same step
        self._sync_time()
        started = time.perf_counter()
        p.checkpoints_written += 1  # counted in the state it writes
        with self._doing("checkpointing"):
            path = self.checkpoints.save(p.global_step, self._parts(), self._meta(), self._files())
        seconds = time.perf_counter() - started
        p.checkpoint_time_s += seconds
        self._saved_step = p.global_step
        if path is not None:
            self.last_checkpoint = path
            record = {"event": "checkpoint", "step": p.global_step, "path": str(path)}
            self.metrics.write({**record, "seconds": seconds})
            self.ctx.log.info("checkpoint written: %s", path)

    def _snapshot(self, manager: CheckpointManager) -> None:
        """Collective: the state into the snapshot folder (recovery/snapshots.py), unless a
        checkpoint of this step exists."""
        p = self.progress
        if self._saved_step == p.global_step:
            return
        self._sync_time()
        with self._doing("checkpointing"):
            try:
                written = manager.save(p.global_step, self._parts(), self._meta(), self._files())
            except DiskFull as exc:  # every rank: the manager agreed on it
                self._snapshot_skipped(str(exc))
                return
            if self.ctx.launch_mode != "shoal":  # across hosts: a copy on the next host
                send_replica(self.ctx.rank, self.ctx.hosts, written, self.ctx.paths)

    def _snapshot_skipped(self, reason: str) -> None:
        """A snapshot only shortens what a restart repeats: one that does not fit in memory
        is skipped with a warning (and a `snapshot_skipped` record), never a rank failure
        that would burn a restart; the newest checkpoint or snapshot stays the restart's."""
        if self.ctx.is_main:
            self.ctx.log.warning(
                "%s; training goes on, a restart resumes from the newest checkpoint or "
                "snapshot (make room there, or snapshot less often: "
                "faults.snapshot_every_steps)",
                reason,
            )
            record = {"event": "snapshot_skipped", "step": self.progress.global_step}
            self.metrics.write({**record, "reason": reason})

    def _save_best(self, manager: CheckpointManager) -> Path | None:
        """Collective: the current state into best/ (the selection calls it on improvement)."""
        p = self.progress
        self._sync_time()
        with self._doing("checkpointing"):
            path = manager.save(p.global_step, self._parts(), self._meta(), self._files())
        if path is not None:
            self.metrics.write({"event": "best", "step": p.global_step, "path": str(path)})
        return path

    def _restore(self, path: Path) -> None:
        ctx = self.ctx
        point = open_resume(ctx, path, self.task.train_size, self.rules)
        point.check_model(self.selection.record.model, point.state.get("model", {}))
        optional = (*self.plan.optional_parts, "config")
        self.run_info.resume = point
        load_parts(point.state, self._parts(), path, optional)
        self.run_info.resume = None
        self._saved_step = self.progress.global_step
        self.last_checkpoint = path
        self.loop.after_restore()
        if ctx.heartbeat is not None:  # failure messages name the resumed position, not -1
            ctx.heartbeat.beat(self.progress.global_step, now=True)
        ctx.log.info(
            "resumed from %s at %s %d (epoch %d)",
            path,
            self.plan.unit,
            point.meta["step"],
            point.meta.get("epoch", 0),
        )

    # ---------------------------------------------------------------- results
    def _finish(self, wall_s: float) -> dict[str, Any]:
        results = self._results(wall_s)
        if self.ctx.is_main:
            atomic_write_json(self.ctx.paths.results, finite(results))
        return results

    def _results(self, wall_s: float) -> dict[str, Any]:
        ctx, p = self.ctx, self.progress
        self._sync_time()
        results: dict[str, Any] = {
            "status": "stopped" if self.stopped else "completed",
            "run_dir": str(ctx.paths.root),
            "task": ctx.config.task.type,
            "strategy": ctx.config.strategy.type,
            "strategy_detail": self.detail,
            "world_size": ctx.world_size,
            "unit": self.plan.unit,
            "steps": p.global_step,
            "wall_time_s": wall_s,
            "train_time_s": p.train_time_s,
            "session_train_time_s": time.perf_counter() - self._session_start,
            **self.loop.section(),
            "train": self.run_info.last_train,
            **self.last_eval,
            "checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None,
        }
        best = self.selection.summary()
        if best is not None:  # the loop's own account of its best (a population's member) too
            results["best"] = {**best, **results.get("best", {})}
        results["stopped_early"] = p.stopped_early
        # the launcher's restart log adds its own count when it restarted the job
        results["counts"] = {"checkpoints": p.checkpoints_written, "failures": 0}
        results["ranks"] = self._rank_figures()
        if self.stopped:
            results["stop"] = self.stopped
        summary = self.task.summary()
        if summary:
            results["data"] = summary
        return results

    def _rank_figures(self) -> dict[str, list[float]]:
        """Collective: each rank's peak memory and checkpoint-writing seconds, by rank."""
        ctx, world = self.ctx, self.ctx.world_size
        mine = [peak_memory_bytes(ctx.device) / 2**20, self.progress.checkpoint_time_s]
        slots = [0.0] * (2 * world)
        slots[2 * ctx.rank : 2 * ctx.rank + 2] = mine
        total = all_reduce_sum(ctx, slots)
        return {"peak_memory_mb": total[0::2], "checkpoint_s": total[1::2]}


def _snapshots(ctx: WorkerContext) -> tuple[CheckpointManager, int] | None:
    """The manager of in-memory snapshots and their interval, when the job takes them: in
    the folder shoal's own launcher owns, or (torchrun, Slurm) in this host's memory with a
    replica on the next host (recovery/replicas.py). Not in a run inside this process."""
    every = ctx.config.faults.snapshot_every_steps
    if not every or ctx.launch_mode == "inprocess":
        return None
    if ctx.launch_mode == "shoal":
        folder = snapshot_dir(ctx.paths)
    else:
        folder = host_snapshot_dir(ctx.paths, create=ctx.is_main)
    return CheckpointManager(ctx, 1, folder, "in-memory snapshot", agree_on_full=True), every


def finite(value: Any) -> Any:
    """JSON has no NaN: a non-finite figure (a failed member's score) is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def plan_totals(plan: Plan) -> tuple[int, int | None]:
    """The progress display's end: positions, and epochs where positions are steps."""
    return plan.total, plan.epochs
