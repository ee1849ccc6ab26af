"""The one loop shape: what a strategy's outer loop answers, and what the driver does with it.

After torchtune's recipe interface and torchtitan's `train.py`.
Every strategy's outer loop is a :class:`UnitLoop`: built with what it needs
(the driver's :class:`Run`), it says what it is in one :class:`Plan`, runs one
*unit* at a time (a step, a federated round, a population generation), names
the parts of its state, hands over its *model of record*, and adds its own
section to results.json. A loop writes only what differs from the defaults:
`__init__` (its `plan`), `done`, `run_unit` and `model_of_record` at least.
Everything around the units lives once, in :class:`~shoal.training.driver.Driver`:

- progress display, metrics.jsonl, heartbeats;
- the stop request (`runtime/stop.py`): after each unit the loop says what its
  ranks agreed on (`agree_stop`); the driver writes the checkpoint and records;
- the schedule: evaluation (every `eval_every` units, at epoch ends of the
  data, at the end), checkpoints (`[checkpoint] every_steps` counts the loop's
  unit, named by `Plan.unit`; `every_epochs` counts epochs of the data; at
  the end), early stopping;
- model selection: validation figures of the model of record are compared by
  the task's primary metric; the best is kept by the model of record (in
  memory, on a server, on the rank that holds a population's member) and in
  `best/`; after training it is put back, the test splits are evaluated with it
  and the task saves its artifacts from it;
- checkpoints assembled from parts (`checkpoint/parts.py`) and restored from
  them; results.json with "status", the loop's counts and its own section.

A unit is the loop's business: the step loop picks the global batch and drives
a :class:`~shoal.training.learner.Learner`; a parameter-server worker drives the
same step loop with collaborators that live on the servers (a learner that
pulls and pushes rows, shard files as a file part, a model of record whose best
snapshot the servers hold); a pipeline schedule (issue 12) is a unit of
micro-batches over stages with its own hooks only. A restart builds the loop
again and loads the parts.

Order after each unit (every rank alike): heartbeat; stop agreement (a stop
writes a checkpoint and ends the run, skipping evaluation and testing);
evaluation due by units; checkpoint due by units; if the unit ended an epoch of
the data, the loop starts the next one and evaluation and checkpoint due by
epochs follow. A resume from a checkpoint at an epoch's last step therefore
redoes that epoch's end, as the uninterrupted run does.

Where each strategy stands: local and data_parallel run the step loop
(`steps.py`); parameter_server runs it with its collaborators
(`strategies/parameter_server/worker_loop.py`); federated runs its round loop
(`strategies/federated/loop.py`); population_based its generation loop
(`strategies/population/loop.py`), whose `progress.global_step` counts
training steps (`Plan.steps_per_unit`), whose validation is the best member's
figures it measured itself (`Plan.validation`, selected by `strategy.metric`
/ `mode`: `Plan.selection`), and whose model of record is the best member,
sent to every rank for the test splits and artifacts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from torch import nn

from shoal.checkpoint.parts import FilePart, StatePart
from shoal.runtime.stop import STOP

if TYPE_CHECKING:
    from shoal.checkpoint.resume import Resume
    from shoal.monitor.metrics import MetricsLog
    from shoal.monitor.progress import ProgressReporter
    from shoal.protocols.task import Task
    from shoal.runtime.context import WorkerContext
    from shoal.training.state import TrainProgress


@dataclass
class Run:
    """What a loop may use of the driver's: the worker, the task, progress and records."""

    ctx: WorkerContext
    task: Task
    progress: TrainProgress
    metrics: MetricsLog
    reporter: ProgressReporter
    last_train: dict[str, float]  # the latest training figures, for results.json
    resume: Resume | None = None  # while the parts load: the checkpoint being resumed
    last_train_step: int = -1  # the step `last_train` was logged at

    def logged_train(self, figures: dict[str, float], step: int) -> None:
        """The latest logged training figures: results.json's "train", and the loss a
        checkpoint's meta.json records with the step it was logged at."""
        self.last_train.clear()
        self.last_train.update(figures)
        self.last_train_step = step


@dataclass
class Plan:
    """What a loop tells the driver once it is built: data only."""

    unit: str  # "step", "round", "generation": what positions and `every_steps` count
    total: int  # positions in the whole run (the progress display's end)
    line: str  # the one-line description logged at the start
    epochs: int | None = None  # epochs of the data, when the positions are steps
    eval_every: int | None = None  # evaluate every this many units (None: by epochs only)
    optional_parts: tuple[str, ...] = field(default=())  # parts older checkpoints may lack
    #: steps of training per unit, when `progress.global_step` counts steps but the unit
    #: is longer (a population's generation of `ready_interval` steps); 1 otherwise
    steps_per_unit: int = 1
    #: checkpoint every this many units instead of `[checkpoint] every_steps` (population's
    #: `checkpoint_every`, in generations; 0: at the end only); None: the config's
    checkpoint_every: int | None = None
    #: (split, metric, "max" | "min") that selects the best model; None: the task's first
    #: evaluation split and primary metric
    selection: tuple[str, str, str] | None = None


class ModelOfRecord(Protocol):
    """The model evaluation, best-model selection, the test split and artifacts see.

    Every method is called on every rank.
    """

    @property
    def model(self) -> nn.Module:
        """The model to evaluate and to export, the same on every rank."""
        ...

    def validated(self, best: bool) -> None:
        """After each validation (collective): `best` says it is the best so far, to be
        remembered."""
        ...

    def restore_best(self, saved: Path | None) -> bool:
        """Put the best model in place for testing (collective); `saved` is the best/
        checkpoint of a resumed run when this session kept none. False: the final
        model stays (and is tested)."""
        ...


class UnitLoop(ABC):
    """A strategy's outer loop, run one unit at a time by the driver.

    A subclass builds everything it needs in `__init__` (no restore yet: the driver
    loads the parts afterwards) and sets `plan`; it must say when it is `done`, how to
    `run_unit` and what its `model_of_record` is. Everything else has a default.
    """

    plan: Plan

    def __init__(self, run: Run) -> None:
        """`run`: the driver's worker, task, progress, metrics log and display."""
        self.run = run
        self.ctx = run.ctx
        self.task = run.task
        self.progress = run.progress

    @abstractmethod
    def done(self) -> bool:
        """No unit left (the driver also ends on early stopping and stop requests)."""

    @abstractmethod
    def run_unit(self) -> bool:
        """One unit; advances the driver's `progress.global_step`. True: it was the last
        unit of an epoch of the data (the driver then calls `next_epoch`)."""

    @abstractmethod
    def model_of_record(self) -> ModelOfRecord:
        """The model evaluation, selection, the test splits and artifacts see."""

    def state_parts(self) -> dict[str, StatePart]:
        """The loop's checkpoint parts, by name (the driver adds progress, rng, config)."""
        return {}

    def file_parts(self) -> list[FilePart]:
        """The loop's state kept in files of its own (none for most loops)."""
        return []

    def after_restore(self) -> None:
        """After the parts were loaded from a checkpoint (e.g. set a clock)."""

    def start(self) -> None:
        """Before the first unit of this session (after a restore)."""

    def next_epoch(self) -> None:
        """Move the data position to the next epoch's start (units with no epochs of the
        data: nothing to move)."""

    def agree_stop(self) -> int:
        """After a unit: the stop signal every rank agreed on (0: go on); by default one
        collective at every unit boundary."""
        return STOP.agree(self.ctx)

    def flush(self) -> None:
        """Record what is pending (a partial logging interval) before the run ends."""

    def observe_metric(self, value: float, direction: str) -> None:
        """After each validation: the primary metric's value, for a schedule that follows
        it (lr_decay = "plateau")."""

    def validation(self) -> dict[str, dict[str, float]] | None:
        """The figures of the model of record, {split: {metric: value}}, when the loop
        measures its validation itself (a population scores every member on its split);
        None (the default): the driver evaluates it on the task's evaluation splits."""
        return None

    def before_checkpoint(self) -> None:
        """Collective, every rank: before each periodic checkpoint (by units or epochs, once
        a position; not the final one nor a stop's), while units remain: a pipeline
        re-balances its partition there, so the checkpoint holds the partition the run
        goes on with."""

    def section(self) -> dict[str, Any]:
        """The loop's own results.json fields (may be collective)."""
        return {}

    def close(self) -> None:
        """After the run, also when it failed (e.g. save a wire audit)."""
