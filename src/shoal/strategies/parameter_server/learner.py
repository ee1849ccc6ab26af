"""A worker's step under the parameter server: pull the batch's rows, compute, push.

The model reads rows through :class:`ServedRows` (its tables are gone, see
`KGEModel.serve_tables`): during a training step, the leaf tensors of the rows
pulled for the batch, so backward leaves each unique row's gradient, duplicates
already summed, in the leaf's `.grad`, which is what is pushed. Outside a step
(evaluation) a read is a fresh pull at the current clock.

On a GPU (workers that share one, `JobShape.shares_gpus`), the pulled rows are
copied to it, the batch is scored there, and the row gradients come back to the
CPU to be pushed: the rows, their optimizer state and every message stay on the
host.

Overlap: right after the current rows arrive and before the current batch is
computed, the next batch's rows are requested (when it lies in the same epoch),
so they travel while this one computes. Under `sync` the server holds that pull
until this step's pushes from every worker are applied, so what the worker reads
is exactly what data-parallel SGD would read.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from shoal.checkpoint.parts import Fixed, StatePart
from shoal.config.train import TrainConfig
from shoal.errors import TrainingHalted
from shoal.protocols.capabilities import SERVED_TABLES
from shoal.protocols.task import LossOutput, Task
from shoal.strategies.parameter_server.client import PendingPull, RowClient
from shoal.strategies.parameter_server.config import ParameterServerStrategyConfig
from shoal.strategies.parameter_server.wire import Op
from shoal.training.batching import EpochPlan, local_share, steps_per_epoch
from shoal.training.contracts import GradientSync
from shoal.training.meter import StepStats
from shoal.training.nonfinite import GradientCheck


class ServedRows:
    """The model's row source on a worker (implements `RowSource`)."""

    def __init__(
        self,
        client: RowClient,
        num_entities: int,
        num_relations: int,
        device: torch.device | None = None,
    ) -> None:
        self.client = client
        self.device = device or torch.device("cpu")  # where the worker scores
        self.num_entities = num_entities
        self.num_relations = num_relations
        self.block_rows = client.max_rows  # candidate rows pulled at once when ranking
        self.clock = 0  # fresh reads wait for every push before this clock
        self.batch: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None

    def rows(self, table: str, ids: torch.Tensor) -> torch.Tensor:
        if self.batch is None:  # evaluation: a fresh pull, the rows to where the ids are
            unique, inverse = torch.unique(ids, return_inverse=True)
            unique = unique.cpu()
            empty = torch.zeros(0, dtype=torch.int64)
            if table == "entity":
                rows, _ = self.client.pull(unique, empty, self.clock, fresh=True).wait()
            else:
                _, rows = self.client.pull(empty, unique, self.clock, fresh=True).wait()
            return rows.to(ids.device)[inverse]
        pulled_ids, leaf = self.batch[table]
        if ids.shape == pulled_ids.shape and torch.equal(ids, pulled_ids):
            # the usual case: the model reads the batch's unique ids, which is what was
            # pulled; the leaf itself, so backward writes its .grad without a gather's
            # backward (a zero fill and a sorted index_put per table and step)
            return leaf
        at = torch.searchsorted(pulled_ids, ids.contiguous())
        if len(ids) and (at.max() >= len(pulled_ids) or not torch.equal(pulled_ids[at], ids)):
            raise RuntimeError(f"the model read {table} rows the batch did not pull")
        return leaf.index_select(0, at)  # backward: index_add_, no sort

    def entity_blocks(self) -> Iterator[torch.Tensor]:
        block = max(1, self.block_rows)
        empty = torch.zeros(0, dtype=torch.int64)
        for start in range(0, self.num_entities, block):
            ids = torch.arange(start, min(start + block, self.num_entities))
            rows, _ = self.client.pull(ids, empty, self.clock, fresh=True).wait()
            yield rows.to(self.device)


class ServerSync(GradientSync):
    """What the trainer asks of a gradient sync, answered from the client's counters."""

    def __init__(self, client: RowClient, reduce: Any, num_workers: int, is_main: bool) -> None:
        self.client = client
        self.num_workers = num_workers
        self.is_main = is_main
        self.reduce = reduce  # collective over workers: (list of numbers) -> sums
        self._last: list[float] = [0.0] * len(client.stats.as_list())
        self._last_time = time.perf_counter()
        self._sent = 0

    def zero_grad(self) -> None:
        return None

    def finish(self) -> float:
        return 0.0

    def take_sent_bytes(self) -> int:
        total = self.client.sent_bytes()
        sent, self._sent = total - self._sent, total
        return sent

    def interval_metrics(self) -> dict[str, float]:
        """Collective over workers: pulls, pushes, rows and bytes per second, barrier wait."""
        now = time.perf_counter()
        current = self.client.stats.as_list()
        delta = [c - p for c, p in zip(current, self._last, strict=True)]
        self._last = current
        total = self.reduce(delta)
        elapsed = max(now - self._last_time, 1e-9)
        self._last_time = now
        pulls, pushes, rows_pulled, rows_pushed, bytes_in, wait_s = total
        workers = max(self.num_workers, 1)
        metrics = {
            "ps_pulls": pulls,
            "ps_pushes": pushes,
            "ps_rows_per_s": (rows_pulled + rows_pushed) / elapsed,
            "ps_pulled_bytes_per_s": bytes_in / elapsed,
            "ps_wait_s": wait_s / workers,
        }
        if self.is_main:  # only rank 0 writes metrics: it alone asks the servers
            metrics.update(server_metrics(self.client.control(Op.STATS, 0, fresh=False)))
        return metrics


def server_metrics(servers: list[Any]) -> dict[str, float]:
    """The servers' statistics so far: apply and hold time, and the staleness histogram
    (`ps_staleness_<k>`: pulls served k clocks ahead of the slowest worker)."""
    metrics = {
        "ps_server_apply_s": sum(s["apply_s"] for s in servers),
        "ps_server_held_s": sum(s["held_s"] for s in servers),
        "ps_server_pushed_bytes": sum(s["bytes_in"] for s in servers),
        "ps_rejected_messages": sum(s["rejected"] for s in servers),
    }
    for stats in servers:
        for key, count in stats["staleness"].items():
            name = f"ps_staleness_{key}"
            metrics[name] = metrics.get(name, 0) + count
    return metrics


class ServerLearner:
    """The trainer's learner for a worker whose parameters live on the servers."""

    def __init__(
        self,
        task: Task,
        model: nn.Module,
        sync: ServerSync,
        served: ServedRows,
        train: TrainConfig,
        config: ParameterServerStrategyConfig,
        share: tuple[int, int],
    ) -> None:
        self.task = task
        self.tables = SERVED_TABLES.of(task, "parameter_server")
        self.model = model
        self.sync = sync
        self.served = served
        self.client = served.client
        self.train = train
        self.config = config
        self.share = share
        self.steps_per_epoch = steps_per_epoch(task.train_size, train.batch_size, train.drop_last)
        self._next: tuple[int, dict[str, Any], PendingPull] | None = None
        self._data_s = 0.0  # the step's reading of batches (its own, the next one's)
        self._plan: tuple[int, EpochPlan] | None = None  # (epoch, its order)
        self.total_steps: int | None = None
        self.device = served.device

    @property
    def lr(self) -> float:
        return self.config.optimizer.lr

    def _global_batch(self, step: int) -> torch.Tensor:
        """Step `step`'s global batch. Its epoch's order (a permutation of the whole
        training set) is made once per epoch and kept: made per step, it cost more than
        the step on graphs of millions of triples."""
        epoch, index = divmod(step, self.steps_per_epoch)
        if self._plan is None or self._plan[0] != epoch:
            train = self.train
            plan = EpochPlan(
                self.task.train_size,
                train.batch_size,
                epoch,
                train.seed,
                train.shuffle,
                train.drop_last,
            )
            self._plan = (epoch, plan)
        return self._plan[1].global_batch(index)

    def _request(self, step: int, global_batch: torch.Tensor) -> tuple[dict[str, Any], PendingPull]:
        """Read the batch (timed as the step's data phase) and ask for its rows."""
        started = time.perf_counter()
        # whole chunks of negatives: the same negatives on any number of workers (elastic)
        batch = self.task.train_batch(local_share(global_batch, *self.share, self.task.batch_unit))
        entity_ids, relation_ids = self.tables.rows_touched(batch)  # on the batch's device
        self._data_s += time.perf_counter() - started
        return batch, self.client.pull(entity_ids.cpu(), relation_ids.cpu(), step)

    def step(self, global_batch: torch.Tensor, global_step: int | None = None) -> StepStats:
        """Pull the batch's rows (prefetched by the step before, with `prefetch`), forward
        and backward, push the row gradients. Phases: data (the batch, also the next
        one's when prefetching), communication wait (waiting for the pull, posting the
        push), optimizer (the worker's part of the update: the non-finite check and the
        norm; the servers apply it, their time is in the parameter-server panel),
        forward/backward (the rest)."""
        started = time.perf_counter()
        self._data_s = 0.0
        assert global_step is not None, "the parameter server needs the clock"
        if self._next is not None and self._next[0] == global_step:
            _, batch, pending = self._next
        else:
            batch, pending = self._request(global_step, global_batch)
        self._next = None
        entity_ids, relation_ids = pending.entity_ids, pending.relation_ids
        entity, relation = pending.wait()
        waited = time.perf_counter() - started - self._data_s
        following = global_step + 1
        if (
            self.config.prefetch
            and following // self.steps_per_epoch == global_step // self.steps_per_epoch
            and (self.total_steps is None or following < self.total_steps)
        ):
            self._next = (following, *self._request(following, self._global_batch(following)))
        device = self.device
        entity = entity.to(device).requires_grad_(True)  # a leaf on the device
        relation = relation.to(device).requires_grad_(True)
        self.served.batch = {
            "entity": (entity_ids.to(device), entity),
            "relation": (relation_ids.to(device), relation),
        }
        samples = len(batch["triples"])
        loss_sum = torch.zeros((), device=device)
        sums: dict[str, torch.Tensor] = {}
        try:
            if samples:
                out: LossOutput = self.task.loss(self.model, batch)
                (out.loss_sum * (1.0 / len(global_batch))).backward()
                loss_sum, sums = out.loss_sum.detach(), {k: v.detach() for k, v in out.sums.items()}
        finally:
            self.served.batch = None
        entity_grad, relation_grad = entity.grad, relation.grad
        if entity_grad is None:  # the loss did not read them (an empty share): push no rows
            entity_ids, entity_grad = entity_ids[:0], entity.detach()[:0]
        if relation_grad is None:
            relation_ids, relation_grad = relation_ids[:0], relation.detach()[:0]
        entity_grad, relation_grad = entity_grad.cpu(), relation_grad.cpu()  # pushed from here
        self.client.note_held(entity, relation, entity_grad, relation_grad)
        checked = time.perf_counter()
        skipped = False
        # one pass of norms over both (a NaN or an Inf makes a norm non-finite; an overflowed
        # one is checked entry by entry), and the norm from them: what data parallelism does
        check = GradientCheck([("entity", entity_grad), ("relation", relation_grad)])
        nonfinite, square = check.read(with_square=True)
        if nonfinite:
            if self.train.on_nonfinite == "halt":
                raise TrainingHalted(
                    f"training halted at step {global_step}: non-finite row gradients (NaN/Inf) "
                    f"in the {' and '.join(nonfinite)} rows on worker {self.client.worker}; "
                    "nothing of this step was pushed, so the newest checkpoint is the last good "
                    "state. Resume from it with a lower "
                    'strategy.optimizer.lr, or set train.on_nonfinite = "skip_step"'
                )
            skipped = True  # push nothing but the clock
            entity_ids, relation_ids = entity_ids[:0], relation_ids[:0]
            entity_grad, relation_grad = entity_grad[:0], relation_grad[:0]
        # this worker's row gradients (no clipping here)
        norm = math.sqrt(square) if square is not None and not skipped else 0.0
        pushing = time.perf_counter()
        self.client.push(entity_ids, entity_grad, relation_ids, relation_grad, global_step)
        self.served.clock = global_step + 1
        ended = time.perf_counter()
        wall = ended - started
        comm_s = waited + (ended - pushing)
        optimizer_s = pushing - checked
        return StepStats(
            loss_sum,
            samples,
            sums,
            wall - comm_s,
            comm_s,
            wall,
            sent_bytes=self.sync.take_sent_bytes(),
            skipped=skipped,
            grad_norm=norm,
            data_s=self._data_s,
            optimizer_s=optimizer_s,
            forward_backward_s=wall - comm_s - self._data_s - optimizer_s,
        )

    def observe_metric(self, value: float, direction: str) -> None:
        """The servers' learning rate is constant (a schedule is refused by the config)."""
        return None

    def parts(self) -> dict[str, StatePart]:
        """The tables are in the servers' shard files (a file part of the job); the worker
        has nothing of its own. An empty model entry tells a resume so."""
        return {"model": Fixed({})}
