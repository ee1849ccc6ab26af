"""The federated round loop: select, train locally, agree on who reported, aggregate, update.

Every worker holds the global model x. A round:

1. every worker computes the selected clients (a function of seed and round);
2. each worker runs its selected hosted clients in turn (client c lives on worker
   c mod workers); a client that raises or passes `round_timeout_s` is dropped;
3. one small all-reduce of report flags and round statistics: every worker now
   knows who reported; fewer than `min_clients` ends the run with a clear error;
4. one all-reduce of [sum_i w_i * Delta_i, sum_i w_i] over the reporting clients
   (in the clear, or pairwise-masked in fixed point under secure aggregation);
   w_i = n_i (samples), or 1 under differential privacy;
5. every worker applies the same server step to x (FedAvg, FedProx, FedOpt).

Only model updates, report flags, round statistics and public keys cross the
process group (see `wire.py`); a client's samples are read only by its worker.
With one worker the loop runs in the calling process and nothing crosses at all.
Checkpoints are taken at round boundaries; since every random draw of a round is
seeded by (train.seed, round, client), a resumed run repeats the rounds exactly.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from shoal.checkpoint.atomic import atomic_write_json
from shoal.checkpoint.manager import CheckpointManager
from shoal.checkpoint.resume import open_resume
from shoal.config import dump_config
from shoal.config.root import ShoalConfig
from shoal.errors import JobFailed, ShoalError
from shoal.monitor.metrics import MetricsLog
from shoal.monitor.progress import ProgressReporter
from shoal.runtime.rng import restore_rng, seed_everything
from shoal.runtime.stop import STOP, stop_record
from shoal.strategies.base import Strategy
from shoal.strategies.federated import privacy, secure
from shoal.strategies.federated.aggregation import AGGREGATIONS, FedAvg
from shoal.strategies.federated.client import ClientDropped, ClientReport, ClientRunner
from shoal.strategies.federated.config import FederatedStrategyConfig
from shoal.strategies.federated.partition import client_shards
from shoal.strategies.federated.selection import select_clients
from shoal.strategies.federated.vector import ModelVector
from shoal.strategies.federated.wire import Wire
from shoal.tasks.base import Task
from shoal.training.contracts import GradientSync, LocalGradientSync
from shoal.training.evaluation import evaluate_splits
from shoal.training.faults import maybe_inject_fault
from shoal.training.optim import build_optimizer

OK, FAILED, TIMED_OUT = 1, 2, 3
STATUS_NAMES = {FAILED: "failed", TIMED_OUT: "timed_out"}


class RoundFailed(JobFailed):
    """Fewer than `min_clients` clients reported in a round."""


class FederatedStrategy(Strategy):
    """Clients train locally on private shards; the global model moves by their averaged update."""

    config_class: ClassVar[type[FederatedStrategyConfig]] = FederatedStrategyConfig

    in_process: ClassVar[bool] = True  # with one worker: no process group, nothing crosses

    @classmethod
    def world_size(cls, config: ShoalConfig) -> int:
        assert isinstance(config.strategy, FederatedStrategyConfig)
        return config.strategy.workers

    workers_field: ClassVar[str | None] = "workers"
    resume_safe: ClassVar[tuple[str, ...]] = (
        "rounds",
        "eval_every_rounds",
        "round_timeout_s",
        "audit_wire",
        "inject",
    )

    @property
    def config(self) -> FederatedStrategyConfig:
        config = self.ctx.config.strategy
        assert isinstance(config, FederatedStrategyConfig)
        return config

    def attach(self, model: nn.Module) -> GradientSync:
        """Clients' gradients stay local (FedProx adds its term through the aggregation)."""
        return LocalGradientSync(model)

    def describe(self) -> str:
        c = self.config
        return f"federated x{self.ctx.world_size} ({c.num_clients} clients, {c.aggregation.method})"

    # ---------------------------------------------------------------- setup
    def _build(self, task: Task) -> None:
        ctx, cfg, train = self.ctx, self.config, self.ctx.config.train
        seed_everything(train.seed)  # the same initial global model on every worker
        self.task = task
        self.model = task.build_model().to(ctx.device)
        self.vector = ModelVector(self.model)
        self.x = self.vector.read()
        self.hosted = [c for c in range(cfg.num_clients) if c % ctx.world_size == ctx.rank]
        self.shards = client_shards(cfg.partition, task, cfg.num_clients, self.hosted)
        self.aggregation: FedAvg = AGGREGATIONS.get(cfg.aggregation.method)(
            cfg.aggregation, self.vector.size
        )
        self.runner = ClientRunner(task, self.vector, self.model, self.aggregation, train, cfg)
        self.wire = Wire(ctx, cfg.audit_wire)
        self.sum_names = self._probe_sums()
        # the first optimizer built in a process imports torch's compile machinery (about a
        # second): pay that now, not inside the first round's deadline
        build_optimizer(self.model.parameters(), train.optimizer)
        self.checkpoints = CheckpointManager(ctx, ctx.config.checkpoint.keep_last)
        self.seeds: dict[int, dict[int, bytes]] = {}
        if cfg.privacy.secure_aggregation:
            self.seeds = self._agree_on_pair_seeds()
        self.completed = 0
        self.totals = {"train_time_s": 0.0, "client_updates": 0, "dropped": 0}
        self.last_eval: dict[str, dict[str, float]] = {}
        self.last_train: dict[str, float] = {}
        self.last_checkpoint: Path | None = None
        self.stopped: dict[str, Any] | None = None
        if ctx.resume_from:
            self._restore(Path(ctx.resume_from))

    def _probe_sums(self) -> list[str]:
        """The names of the task's additive statistics (e.g. accuracy), the same on every worker."""
        with torch.no_grad():
            out = self.task.loss(self.model, self.task.train_batch(torch.tensor([0])))
        return sorted(out.sums)

    def _agree_on_pair_seeds(self) -> dict[int, dict[int, bytes]]:
        """Diffie-Hellman: hosted clients publish public keys; each pair derives its own seed."""
        n = self.config.num_clients
        keys = {c: secure.KeyPair() for c in self.hosted}
        table = torch.zeros(n, secure.KEY_BYTES, dtype=torch.uint8)
        for client, pair in keys.items():
            table[client] = torch.frombuffer(bytearray(pair.public_bytes()), dtype=torch.uint8)
        gathered = self.wire.all_gather(table, "public_keys")
        public = {c: bytes(gathered[c % len(gathered)][c].numpy().tobytes()) for c in range(n)}
        return {
            c: {peer: pair.shared_seed(public[peer]) for peer in range(n) if peer != c}
            for c, pair in keys.items()
        }

    # ---------------------------------------------------------------- the loop
    def run(self, task: Task) -> dict[str, Any]:
        started = time.perf_counter()
        self._build(task)
        ctx, cfg = self.ctx, self.config
        self.metrics = MetricsLog(ctx.paths.metrics, enabled=ctx.is_main)
        self.reporter = ProgressReporter(ctx.config.monitor.progress, ctx.is_main, cfg.rounds, None)
        ctx.log.info(
            "training %s with %s: %d rounds, clients %s hosted here (%s samples), %d values "
            "per update",
            ctx.config.task.type,
            self.describe(),
            cfg.rounds,
            self.hosted,
            [len(self.shards[c]) for c in self.hosted],
            self.vector.size,
        )
        session_start = time.perf_counter()
        time_base = self.totals["train_time_s"]
        try:
            self.reporter.start(self.completed)
            for rnd in range(self.completed, cfg.rounds):
                maybe_inject_fault(ctx, rnd)
                self._round(rnd)
                self.completed = rnd + 1
                self.totals["train_time_s"] = time_base + time.perf_counter() - session_start
                if ctx.heartbeat is not None:
                    ctx.heartbeat.beat(self.completed)
                # at the round boundary, alike on every worker (counted and audited by the wire)
                signum = STOP.agree(ctx, lambda t: self.wire.all_reduce_sum(t, "stop_request"))
                if signum:
                    self._stop(signum)
                    break
                last = self.completed == cfg.rounds
                every_eval = cfg.eval_every_rounds
                if (every_eval and self.completed % every_eval == 0) or last:
                    self._evaluate()
                every_ckpt = ctx.config.checkpoint.every_steps
                if (every_ckpt and self.completed % every_ckpt == 0) or (
                    last and ctx.config.checkpoint.at_end
                ):
                    self._save()
                self.reporter.update(self.completed, 0)
        finally:
            self.reporter.close()
            self.metrics.close()
            if cfg.audit_wire:
                self.wire.save(ctx.paths.logs / f"wire-rank-{ctx.rank}.pt")
        return self._finish(time.perf_counter() - started)

    def _stop(self, signum: int) -> None:
        """A stop request after round `self.completed`: checkpoint it and record the stop."""
        self._save()
        self.stopped = stop_record(signum, self.completed, str(self.last_checkpoint))
        self.metrics.write({"event": "stopped", "round": self.completed, **self.stopped})
        self.ctx.log.info("stopped by %s after round %d", self.stopped["signal"], self.completed)

    def _round(self, rnd: int) -> None:
        ctx, cfg = self.ctx, self.config
        started = time.perf_counter()
        selected = select_clients(cfg, ctx.config.train.seed, rnd)
        deadline = time.monotonic() + cfg.round_timeout_s if cfg.round_timeout_s else None
        faults = {f.client: f for f in cfg.inject if f.round == rnd}
        status = torch.zeros(cfg.num_clients, dtype=torch.float64)
        reports: dict[int, ClientReport] = {}
        for client in (c for c in selected if c in self.shards):
            try:
                reports[client] = self.runner.run(
                    client, self.shards[client], rnd, self.x, deadline, faults.get(client)
                )
                status[client] = OK
            except ClientDropped as exc:
                status[client] = TIMED_OUT
                ctx.log.warning("round %d: client %d dropped (timed out): %s", rnd, client, exc)
            except Exception as exc:
                status[client] = FAILED
                ctx.log.warning(
                    "round %d: client %d dropped (failed): %s: %s",
                    rnd,
                    client,
                    type(exc).__name__,
                    exc,
                )
                ctx.log.info("client %d's error:\n%s", client, traceback.format_exc())
            if ctx.heartbeat is not None:
                ctx.heartbeat.beat(self.completed)

        # 3. who reported, and the round's statistics (sums over this worker's reporters)
        contributions = self._contributions(reports)
        stats = [
            sum(r.loss_sum for r in reports.values()),
            sum(r.trained for r in reports.values()),
            *(sum(r.sums.get(n, 0.0) for r in reports.values()) for n in self.sum_names),
            sum(
                float(torch.linalg.vector_norm(r.update))
                for r in reports.values()
                if r.update is not None
            ),
            sum(clipped for _, clipped in contributions.values()),
            sum(secure.fixed_point_magnitude(v) for v, _ in contributions.values()),
        ]
        shared = torch.cat([status, torch.tensor(stats, dtype=torch.float64)])
        self.wire.all_reduce_sum(shared, "round_status")
        status = shared[: cfg.num_clients].round().long()
        reported = [c for c in selected if status[c] == OK]
        dropped = {
            name: [c for c in selected if status[c] == code] for code, name in STATUS_NAMES.items()
        }
        if len(reported) < cfg.min_clients:
            raise RoundFailed(self._too_few(rnd, selected, reported, dropped))

        # 4. the aggregate of the reporters' weighted updates
        total = self._aggregate(rnd, contributions, reported, float(shared[-1]))
        weight = float(total[-1])
        delta = (total[:-1] / weight).float()

        # 5. the server step, the same on every worker
        self.aggregation.server_step(self.x, delta)
        self.vector.write(self.x)
        self._log_round(rnd, started, selected, reported, dropped, shared, delta)

    def _contributions(
        self, reports: dict[int, ClientReport]
    ) -> dict[int, tuple[torch.Tensor, bool]]:
        """Each reporter's [w_i * Delta_i, w_i] in float64, and whether DP clipped it.

        Under differential privacy the noise share depends on how many clients
        reported, so it is added later, in `_aggregate`.
        """
        dp = self.config.privacy.differential
        out = {}
        for client, report in reports.items():
            assert report.update is not None
            update = report.update.double()
            clipped = False
            if dp is not None:
                update, clipped = privacy.clip_update(update, dp.clip_norm)
                weight = 1.0
            else:
                weight = float(report.samples)
            out[client] = (torch.cat([update * weight, torch.tensor([weight])]), clipped)
        return out

    def _aggregate(
        self,
        rnd: int,
        contributions: dict[int, tuple[torch.Tensor, bool]],
        reported: list[int],
        magnitude: float,
    ) -> torch.Tensor:
        """sum over reporters of [w_i * Delta_i (+ noise), w_i], in the clear or masked."""
        cfg = self.config
        dp = cfg.privacy.differential
        size = self.vector.size + 1
        vectors = {}
        for client, (vector, _) in contributions.items():
            if dp is not None and dp.noise_multiplier > 0:
                noise = privacy.noise_share(
                    size - 1, dp.noise_multiplier, dp.clip_norm, len(reported)
                )
                vector = vector + torch.cat([noise, torch.zeros(1, dtype=torch.float64)])
            vectors[client] = vector
        if not cfg.privacy.secure_aggregation:
            local = torch.zeros(size, dtype=torch.float64)
            for vector in vectors.values():
                local += vector
            wire = local.float()
            self.wire.all_reduce_sum(wire, "model_update")
            return wire.double()
        if dp is not None:  # the noise's sum has std sigma * C: allow 10 of those on top
            magnitude += 10 * dp.noise_multiplier * dp.clip_norm * (1 << secure.FRACTION_BITS)
        if magnitude >= secure.RANGE_LIMIT:
            scale = float(1 << secure.FRACTION_BITS)
            raise ShoalError(
                f"round {rnd}: secure aggregation: the sum of the clients' weighted updates may "
                f"reach {magnitude / scale:.3g}, beyond the fixed-point range "
                f"(+-{secure.RANGE_LIMIT / scale:.3g}); lower train.optimizer.lr or bound the "
                "updates with strategy.privacy.differential.clip_norm"
            )
        local = torch.zeros(size, dtype=torch.int64)
        for client, vector in vectors.items():
            local += secure.mask(client, secure.encode(vector), self.seeds[client], reported, rnd)
        self.wire.all_reduce_sum(local, "masked_model_update")
        return secure.decode(local)

    def _too_few(
        self, rnd: int, selected: list[int], reported: list[int], dropped: dict[str, list[int]]
    ) -> str:
        why = "; ".join(f"{name}: clients {ids}" for name, ids in dropped.items() if ids)
        why = why or "none dropped"
        return (
            f"round {rnd}: only {len(reported)} of {len(selected)} selected clients reported, "
            f"fewer than strategy.min_clients = {self.config.min_clients} ({why}); "
            "see the workers' logs for each client's error"
        )

    # ---------------------------------------------------------------- reporting
    def _log_round(
        self,
        rnd: int,
        started: float,
        selected: list[int],
        reported: list[int],
        dropped: dict[str, list[int]],
        shared: torch.Tensor,
        delta: torch.Tensor,
    ) -> None:
        cfg = self.config
        n = cfg.num_clients
        stats = shared[n:].tolist()
        loss_sum, trained = stats[0], max(stats[1], 1.0)
        sums = dict(zip(self.sum_names, stats[2 : 2 + len(self.sum_names)], strict=True))
        norm_sum, clipped = stats[2 + len(self.sum_names)], stats[3 + len(self.sum_names)]
        model_bytes = self.vector.size * 4
        record: dict[str, Any] = {
            "event": "round",
            "round": rnd + 1,
            "step": rnd + 1,
            "selected": len(selected),
            "participants": len(reported),
            "clients": reported,
            "dropped": sum(len(v) for v in dropped.values()),
            **{f"dropped_{name}": ids for name, ids in dropped.items()},
            "loss": loss_sum / trained,
            **{f"train_{name}": value / trained for name, value in sums.items()},
            "update_norm": float(torch.linalg.vector_norm(delta)),
            "client_bytes_down": len(selected) * model_bytes,
            "client_bytes_up": len(reported) * (model_bytes + 4),
            "wire_bytes_sent_per_worker": self.wire.sent_bytes,
            "wire_bytes_received_per_worker": self.wire.received_bytes,
            "round_s": time.perf_counter() - started,
        }
        if not cfg.privacy.secure_aggregation:
            record["client_update_norm_mean"] = norm_sum / max(len(reported), 1)
        dp = cfg.privacy.differential
        if dp is not None:
            record["dp_noise_multiplier"] = dp.noise_multiplier
            record["dp_clip_norm"] = dp.clip_norm
            record["dp_clipped"] = int(clipped)
            record["dp_noise_std"] = dp.noise_multiplier * dp.clip_norm / len(reported)
        self.totals["client_updates"] += len(reported)
        self.totals["dropped"] += record["dropped"]
        self.last_train = {"loss": record["loss"]}
        self.last_train.update({k: record[f"train_{k}"] for k in sums})
        self.metrics.write(record)
        drops = f", {record['dropped']} dropped" if record["dropped"] else ""
        self.reporter.note(
            f"round {rnd + 1}/{cfg.rounds}: {len(reported)}/{len(selected)} clients{drops}, "
            f"loss {record['loss']:.4f}, update norm {record['update_norm']:.4f}, "
            f"{record['round_s']:.2f} s"
        )
        if record["dropped"]:
            self.ctx.log.info("round %d: dropped %s", rnd, dropped)

    def _evaluate(self) -> None:
        evaluate_splits(
            self.task,
            self.model,
            self.task.eval_splits(),
            event={"event": "eval", "round": self.completed, "step": self.completed},
            label=f"round {self.completed}",
            metrics=self.metrics,
            reporter=self.reporter,
            log=self.ctx.log,
            into=self.last_eval,
        )

    # ---------------------------------------------------------------- checkpoints
    def _save(self) -> None:
        ctx = self.ctx
        state: dict[str, Any] = {}
        if ctx.is_main:
            state = {
                "model": self.model.state_dict(),
                "server": self.aggregation.state_dict(),
                "progress": {"round": self.completed, **self.totals},
                "config": dump_config(ctx.config),
            }
        meta = {
            "round": self.completed,
            "epoch": 0,
            "step_in_epoch": 0,
            "train_size": self.task.train_size,
        }
        path = self.checkpoints.save(self.completed, state, meta)
        if path is not None:
            self.last_checkpoint = path
            self.metrics.write({"event": "checkpoint", "step": self.completed, "path": str(path)})
            ctx.log.info("checkpoint written: %s", path)

    def _restore(self, path: Path) -> None:
        point = open_resume(self.ctx, path, self.task.train_size)
        state = point.state
        if "server" not in state:
            raise ShoalError(f"{path}: not a federated checkpoint; resume it with its own strategy")
        point.check_model(self.model, state["model"])
        self.model.load_state_dict(state["model"])
        self.x = self.vector.read()
        self.aggregation.load_state_dict(state["server"])
        progress = dict(state["progress"])
        self.completed = int(progress.pop("round"))
        self.totals.update(progress)
        self.last_checkpoint = path
        if self.ctx.heartbeat is not None:  # failure messages name the resumed round
            self.ctx.heartbeat.beat(self.completed, now=True)
        rng = state["rng"]
        if len(rng) == self.ctx.world_size:
            restore_rng(bytes(rng[self.ctx.rank].numpy().tobytes()))
        self.ctx.log.info("resumed from %s after round %d", path, self.completed)

    # ---------------------------------------------------------------- results
    def _finish(self, wall_s: float) -> dict[str, Any]:
        ctx, cfg = self.ctx, self.config
        results: dict[str, Any] = {
            "status": "stopped" if self.stopped else "completed",
            "run_dir": str(ctx.paths.root),
            "task": ctx.config.task.type,
            "strategy": ctx.config.strategy.type,
            "strategy_detail": self.describe(),
            "world_size": ctx.world_size,
            "rounds": self.completed,
            "steps": self.completed,
            "num_clients": cfg.num_clients,
            "client_updates": self.totals["client_updates"],
            "dropped_clients": self.totals["dropped"],
            "wall_time_s": wall_s,
            "train_time_s": self.totals["train_time_s"],
            "train": self.last_train,
            **self.last_eval,
            "checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None,
        }
        if self.stopped:
            results["stop"] = self.stopped
        if ctx.is_main:
            atomic_write_json(ctx.paths.results, results)
        return results
