"""The shared training loop every synchronous strategy runs.

One loop, with the strategy's :class:`GradientSync` as its only distributed
piece: the trainer picks each step's global batch and hands it to its
:class:`~shoal.training.learner.Learner` (this rank's slice, micro-batches,
gradient sync, global-norm clipping, optimizer and schedule), and around that
logs, evaluates and checkpoints. A checkpoint holds the model, optimizer, schedule,
strategy state, data position and every rank's RNG state, so a resumed run on
CPU ends bit-identical to one that never stopped.

Model selection, for every task: each validation is compared with the best so
far by the task's `primary_metric`; an improvement is kept in `best/` (written
atomically) and in memory, and `train.early_stopping_patience` evaluations
without one end training. After training the best model is restored, evaluated
on the task's test splits (into results.json) and handed to the task to save its
artifacts.

A stop request (SIGTERM, SIGINT; `runtime/stop.py`) ends the loop at a step
boundary every rank agreed on: the trainer writes a checkpoint there, skips the
remaining evaluation and testing, and reports `"status": "stopped"`.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from shoal.checkpoint.atomic import atomic_write_json
from shoal.checkpoint.manager import CheckpointManager, list_checkpoints, load_checkpoint
from shoal.checkpoint.resume import open_resume
from shoal.config import dump_config
from shoal.errors import ShoalError
from shoal.monitor.metrics import MetricsLog
from shoal.monitor.progress import ProgressReporter
from shoal.runtime.context import WorkerContext
from shoal.runtime.rng import restore_rng, seed_everything, worker_seed
from shoal.runtime.stop import STOP, stop_record
from shoal.tasks.base import Task
from shoal.training.batching import EpochPlan, steps_per_epoch
from shoal.training.contracts import GradientSync, TrainingStrategy
from shoal.training.evaluation import evaluate_splits
from shoal.training.faults import maybe_inject_fault
from shoal.training.learner import Learner
from shoal.training.meter import IntervalMeter
from shoal.training.state import TrainProgress


class Trainer:
    def __init__(self, ctx: WorkerContext, task: Task, strategy: TrainingStrategy) -> None:
        self.ctx = ctx
        self.task = task
        self.strategy = strategy
        self.train = ctx.config.train
        self.progress = TrainProgress()
        self.last_eval: dict[str, dict[str, float]] = {}
        self.last_train: dict[str, float] = {}
        self.last_checkpoint: Path | None = None
        self._saved_step = -1
        self._evaluated_step = -1
        self._best_state: dict[str, torch.Tensor] | None = None
        self.best_checkpoint: Path | None = None
        self.stopped: dict[str, Any] | None = None  # how a stop request ended the run

    # ---------------------------------------------------------------- setup
    def _build(self) -> None:
        ctx, train = self.ctx, self.train
        seed_everything(train.seed)  # identical initial parameters on every rank
        model = self._build_model()
        sync = self.strategy.attach(model)
        self.steps_per_epoch = steps_per_epoch(
            self.task.train_size, train.batch_size, train.drop_last
        )
        if self.steps_per_epoch == 0:
            raise ShoalError(
                f"train.batch_size ({train.batch_size}) exceeds the {self.task.train_size} "
                "training samples and drop_last = true: no step would run"
            )
        self.total_steps = self._total_steps()
        self.learner = self._make_learner(model, sync)
        self.checkpoints = CheckpointManager(ctx, ctx.config.checkpoint.keep_last)
        self.best_checkpoints = CheckpointManager(ctx, 1, ctx.paths.best)
        if ctx.resume_from:
            self._restore(Path(ctx.resume_from))
        else:
            seed_everything(worker_seed(train.seed, ctx.rank))

    def _build_model(self) -> torch.nn.Module:
        return self.task.build_model().to(self.ctx.device)

    def _make_learner(self, model: torch.nn.Module, sync: GradientSync) -> Learner:
        ctx = self.ctx
        return Learner(
            self.task, model, sync, self.train, self.total_steps, share=(ctx.rank, ctx.world_size)
        )

    def _total_steps(self) -> int:
        limits = []
        if self.train.epochs is not None:
            limits.append(self.train.epochs * self.steps_per_epoch)
        if self.train.max_steps is not None:
            limits.append(self.train.max_steps)
        return min(limits)

    def _done(self) -> bool:
        p = self.progress
        return (
            p.stopped_early
            or p.global_step >= self.total_steps
            or (self.train.epochs is not None and p.epoch >= self.train.epochs)
        )

    # ---------------------------------------------------------------- the loop
    def fit(self) -> dict[str, Any]:
        started = time.perf_counter()
        self._build()
        ctx = self.ctx
        self.metrics = MetricsLog(ctx.paths.metrics, enabled=ctx.is_main)
        self.reporter = ProgressReporter(
            ctx.config.monitor.progress, ctx.is_main, self.total_steps, self.train.epochs
        )
        ctx.log.info(
            "training %s with %s: %d samples, %d steps/epoch, %d steps in all",
            ctx.config.task.type,
            self.strategy.describe(),
            self.task.train_size,
            self.steps_per_epoch,
            self.total_steps,
        )
        try:
            self._loop()
            if self.stopped is None:
                self._test_and_save_artifacts()
        finally:
            self.reporter.close()
            self.metrics.close()
        return self._finish(time.perf_counter() - started)

    def _loop(self) -> None:
        train, p = self.train, self.progress
        log_every = self.ctx.config.monitor.log_every_steps
        every_steps = self.ctx.config.checkpoint.every_steps
        meter = IntervalMeter()
        self.reporter.start(p.global_step)
        self._session_start = time.perf_counter()
        self._time_base = p.train_time_s
        self.learner.model.train()
        while not self._done():
            self.task.set_epoch(p.epoch)
            plan = EpochPlan(
                self.task.train_size,
                train.batch_size,
                p.epoch,
                train.seed,
                train.shuffle,
                train.drop_last,
            )
            while p.step_in_epoch < plan.num_steps and not self._done():
                undo_fault = maybe_inject_fault(self.ctx, p.global_step, self.learner.model)
                batch = plan.global_batch(p.step_in_epoch)
                try:
                    stats = self.learner.step(batch, global_step=p.global_step)
                finally:
                    undo_fault()
                p.step_in_epoch += 1
                p.global_step += 1
                p.samples_seen += len(batch)
                p.compute_time_s += stats.compute_s
                p.comm_time_s += stats.comm_s
                p.sent_bytes += stats.sent_bytes
                p.skipped_steps += int(stats.skipped)
                meter.add(stats)
                if self.ctx.heartbeat is not None:
                    self.ctx.heartbeat.beat(p.global_step)
                if p.global_step % log_every == 0:
                    self._log_interval(meter)
                    meter = IntervalMeter()
                else:
                    self.reporter.update(p.global_step, p.epoch)
                if every_steps and p.global_step % every_steps == 0:
                    self._save()
                signum = self._stop_signal(log_every)
                if signum:  # before the epoch's end: a resume then does what this run skips
                    self._stop(signum, meter)
                    return
            if p.step_in_epoch >= plan.num_steps:
                p.epoch += 1
                p.step_in_epoch = 0
                self._end_of_epoch()
        if meter.steps:
            self._log_interval(meter)
        signum = STOP.agree(self.ctx)  # a request that came after the last step's agreement
        if signum:
            self._stop(signum, IntervalMeter())
            return
        if self._evaluated_step != p.global_step:
            self._evaluate()
        if self.ctx.config.checkpoint.at_end and self._saved_step != p.global_step:
            self._save()

    def _stop_signal(self, every: int) -> int:
        """After a step: the stop signal every rank agreed on (0: go on). The gradient sync's
        per-step all-reduce carries the agreement; a sync without one (the parameter server's
        workers train asynchronously) is asked every `every` steps, alike on every rank."""
        agreed = STOP.take_agreed()
        if agreed is not None:
            return agreed
        if not self.ctx.distributed or self.ctx.world_size == 1:
            return STOP.signum
        return STOP.agree(self.ctx) if self.progress.global_step % every == 0 else 0

    def _stop(self, signum: int, meter: IntervalMeter) -> None:
        """Every rank, at the same step: log what is pending, write a checkpoint, record it."""
        p = self.progress
        if meter.steps:
            self._log_interval(meter)
        if self._saved_step != p.global_step:
            self._save()
        checkpoint = str(self.last_checkpoint) if self._saved_step == p.global_step else None
        self.stopped = stop_record(signum, p.global_step, checkpoint)
        self.metrics.write({"event": "stopped", **self.stopped})
        self.reporter.note(f"stopped by {self.stopped['signal']} at step {p.global_step}")
        self.ctx.log.info("stopped by %s at step %d", self.stopped["signal"], p.global_step)

    def _end_of_epoch(self) -> None:
        epoch = self.progress.epoch
        every_eval = self.train.eval_every_epochs
        if every_eval and epoch % every_eval == 0:
            self._evaluate()
        every_ckpt = self.ctx.config.checkpoint.every_epochs
        if every_ckpt and epoch % every_ckpt == 0:
            self._save()

    # ---------------------------------------------------------------- reporting
    def _log_interval(self, meter: IntervalMeter) -> None:
        metrics = meter.reduce(self.ctx)
        metrics.update(self.learner.sync.interval_metrics())
        p = self.progress
        metrics["lr"] = self.learner.lr
        self.last_train = {
            k.removeprefix("train_"): v
            for k, v in metrics.items()
            if k == "loss" or k.startswith("train_")
        }
        epoch = p.last_step_epoch  # the interval's epoch, also after the last one has ended
        self.metrics.write({"event": "train", "step": p.global_step, "epoch": epoch, **metrics})
        self.reporter.update(p.global_step, epoch, metrics)

    def _evaluate(self) -> None:
        p = self.progress
        evaluate_splits(
            self.task,
            self.learner.model,
            self.task.eval_splits(),
            event={"event": "eval", "step": p.global_step, "epoch": p.epoch},
            label=f"step {p.global_step} epoch {p.epoch}",
            metrics=self.metrics,
            reporter=self.reporter,
            log=self.ctx.log,
            into=self.last_eval,
        )
        self._evaluated_step = p.global_step
        self._track_best()
        self._observe_for_schedule()

    def _observe_for_schedule(self) -> None:
        """Hand the validation value of the primary metric to the learner's schedule
        (lr_decay = "plateau" lowers the rate on it)."""
        splits = self.task.eval_splits()
        name, direction = self.task.primary_metric
        value = self.last_eval.get(splits[0], {}).get(name) if splits else None
        if value is not None:
            self.learner.observe_metric(value, direction)

    # ---------------------------------------------------------------- model selection
    def _track_best(self) -> None:
        """Compare the latest validation with the best so far; keep it or count towards patience.

        Every rank takes the same decision: evaluation results are identical on all ranks.
        """
        splits = self.task.eval_splits()
        name, direction = self.task.primary_metric
        value = self.last_eval.get(splits[0], {}).get(name) if splits else None
        if value is None or math.isnan(value):
            return
        p = self.progress
        delta = self.train.early_stopping_min_delta
        if p.best_metric is None or (
            value > p.best_metric + delta if direction == "max" else value < p.best_metric - delta
        ):
            p.best_metric, p.best_step, p.evals_without_improvement = value, p.global_step, 0
            self._best_state = {
                key: tensor.detach().to("cpu", copy=True)
                for key, tensor in self.learner.model.state_dict().items()
            }
            if self.ctx.config.checkpoint.keep_best:
                self._save(self.best_checkpoints)
            return
        p.evals_without_improvement += 1
        patience = self.train.early_stopping_patience
        if patience is not None and p.evals_without_improvement >= patience:
            p.stopped_early = True
            message = (
                f"early stop at step {p.global_step}: {splits[0]} {name} has not improved for "
                f"{patience} evaluations (best {p.best_metric:.4f} at step {p.best_step})"
            )
            self.reporter.note(message)
            self.ctx.log.info(message)

    def _test_and_save_artifacts(self) -> None:
        """Restore the best model, evaluate the test splits with it, let the task save artifacts."""
        model, p = self.learner.model, self.progress
        if self._best_state is None and p.best_metric is not None:
            self._best_state = self._load_best_state()
        if self._best_state is not None:
            model.load_state_dict(self._best_state)
        step = p.best_step if self._best_state is not None else p.global_step
        evaluate_splits(
            self.task,
            model,
            self.task.test_splits(),
            event={"event": "test", "model_step": step},
            label=f"model of step {step},",
            metrics=self.metrics,
            reporter=self.reporter,
            log=self.ctx.log,
            into=self.last_eval,
        )
        self.task.save_artifacts(model)

    def _load_best_state(self) -> dict[str, torch.Tensor] | None:
        """The best model of a resumed run, from best/ (None if it was not kept)."""
        found = list_checkpoints(self.ctx.paths.best)
        if not found:
            self.ctx.log.warning("no best/ checkpoint to restore: testing the final model")
            return None
        self.best_checkpoint = found[-1]
        state, _ = load_checkpoint(found[-1])
        model_state: dict[str, torch.Tensor] = state["model"]
        return model_state

    # ---------------------------------------------------------------- checkpoints
    def _sync_time(self) -> None:
        self.progress.train_time_s = self._time_base + time.perf_counter() - self._session_start

    def _save(self, manager: CheckpointManager | None = None) -> None:
        """Collective: write a checkpoint with `manager` (default: the periodic checkpoints)."""
        ctx, p = self.ctx, self.progress
        if manager is None and self._saved_step == p.global_step:
            return  # e.g. every_steps and every_epochs at the same step
        self._sync_time()
        state: dict[str, Any] = {}
        strategy_state = self.strategy.state_dict()  # collective: may gather every rank's state
        if ctx.is_main:
            state = {
                **self.learner.state_dict(),
                "progress": p.state_dict(),
                "strategy": strategy_state,
                "config": dump_config(ctx.config),
            }
        meta = {
            "epoch": p.epoch,
            "step_in_epoch": p.step_in_epoch,
            "train_size": self.task.train_size,
        }
        if manager is not None:
            path = manager.save(p.global_step, state, meta, self._all_checkpoint_files)
            if path is not None:
                self.best_checkpoint = path
                self.metrics.write({"event": "best", "step": p.global_step, "path": str(path)})
            return
        path = self.checkpoints.save(p.global_step, state, meta, self._all_checkpoint_files)
        self._saved_step = p.global_step
        if path is not None:
            self.last_checkpoint = path
            self.metrics.write({"event": "checkpoint", "step": p.global_step, "path": str(path)})
            ctx.log.info("checkpoint written: %s", path)

    def _all_checkpoint_files(self, folder: Path) -> dict[str, str]:
        """Rank 0: the task's files and the strategy's, written into a checkpoint folder."""
        return {**self.task.checkpoint_files(folder), **self._checkpoint_files(folder)}

    def _checkpoint_files(self, folder: Path) -> dict[str, str]:
        """Rank 0, while a checkpoint folder is assembled: write files of the strategy's own
        into it; returns {file name: sha256}. Nothing by default."""
        return {}

    def _restore(self, path: Path) -> None:
        ctx = self.ctx
        point = open_resume(ctx, path, self.task.train_size)
        state, meta = point.state, point.meta
        point.check_model(self.learner.model, state["model"])
        self.learner.load_state_dict(state)
        self.progress.load_state_dict(state["progress"])
        self.strategy.load_state_dict(state.get("strategy", {}))
        self._saved_step = self.progress.global_step
        self.last_checkpoint = path
        if ctx.heartbeat is not None:  # failure messages name the resumed step, not -1
            ctx.heartbeat.beat(self.progress.global_step, now=True)
        rng = state["rng"]
        if len(rng) == ctx.world_size:
            restore_rng(bytes(rng[ctx.rank].numpy().tobytes()))
        else:
            ctx.log.warning(
                "resuming with %d workers from a checkpoint of %d: training continues correctly "
                "but random draws differ from an uninterrupted run",
                ctx.world_size,
                len(rng),
            )
            seed_everything(worker_seed(self.train.seed + self.progress.global_step, ctx.rank))
        ctx.log.info("resumed from %s at step %d (epoch %d)", path, meta["step"], meta["epoch"])

    # ---------------------------------------------------------------- results
    def _finish(self, wall_s: float) -> dict[str, Any]:
        results = self._results(wall_s)
        if self.ctx.is_main:
            atomic_write_json(self.ctx.paths.results, results)
        return results

    def _results(self, wall_s: float) -> dict[str, Any]:
        """What results.json holds (a subclass adds its own sections)."""
        ctx, p = self.ctx, self.progress
        self._sync_time()
        session_train_s = time.perf_counter() - self._session_start
        results: dict[str, Any] = {
            "status": "stopped" if self.stopped else "completed",
            "run_dir": str(ctx.paths.root),
            "task": ctx.config.task.type,
            "strategy": ctx.config.strategy.type,
            "strategy_detail": self.strategy.describe(),
            "world_size": ctx.world_size,
            "epochs": p.epoch,
            "steps": p.global_step,
            "samples": p.samples_seen,
            "wall_time_s": wall_s,
            "train_time_s": p.train_time_s,
            "samples_per_s": p.samples_seen / p.train_time_s if p.train_time_s else 0.0,
            "session_train_time_s": session_train_s,
            "time_s": {"compute": p.compute_time_s, "communication": p.comm_time_s},
            "gradient_bytes_per_step": self.learner.sync.bytes_per_step(),
            "sent_bytes_per_step": p.sent_bytes / p.global_step if p.global_step else 0.0,
            "skipped_steps": p.skipped_steps,
            "train": self.last_train,
            **self.last_eval,
            "checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None,
        }
        if p.best_metric is not None:
            results["best"] = {
                "metric": self.task.primary_metric[0],
                "value": p.best_metric,
                "step": p.best_step,
                "checkpoint": str(self.best_checkpoint) if self.best_checkpoint else None,
            }
        results["stopped_early"] = p.stopped_early
        if self.stopped:
            results["stop"] = self.stopped
        summary = self.task.summary()
        if summary:
            results["data"] = summary
        return results
