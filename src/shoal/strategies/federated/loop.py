"""The federated round loop: select, train locally, agree on who reported, aggregate, update.

Every worker holds the global model x. A round:

1. every worker computes the selected clients (a function of seed and round);
2. each worker runs its selected hosted clients in turn (`balance`: client c lives
   on worker c mod workers, or where a longest-first placement by expected work put
   it; or, dynamic, a worker takes the next selected client, longest first, from a
   queue in the job's store whenever it is free); a client that raises or passes
   `round_timeout_s` is dropped;
3. one small all-reduce of report flags, run counts and round statistics: every
   worker now knows who reported (and that each selected client ran exactly once);
   fewer than `min_clients` ends the run with a clear error;
4. one all-reduce of [sum_i w_i * Delta_i, sum_i w_i] over the reporting clients
   (in the clear as exact fixed-point integers, `exact.py`, so the sum is the same
   whoever ran which client; or pairwise-masked in fixed point under secure
   aggregation); w_i = n_i (samples), or 1 under differential privacy;
5. every worker applies the same server step to x (FedAvg, FedProx, FedOpt).

Each worker times its round in the step loop's phases (`training/meter.py`'s
`RankPhases`): its clients' local steps (data, forward/backward, optimizer), the
round's communication wait (the status and update all-reduces: a fast worker
waits there for the slowest), the server step (optimizer) and the rest of the
round (client setup, computing the update: `other`); one more small all-reduce of
these figures puts every worker's bar in the round's record.

Only model updates, report flags, round statistics and public keys cross the
process group (a CommGroup, `comm/links.py`, audited by `wire.py`); a client's
samples are read only by its worker.
With one worker the loop runs in the calling process and nothing crosses at all.
The unit of this loop is a round (`training/loop.py`): the driver evaluates the
global model every `eval_every_rounds` rounds, keeps the best one (`best/`),
tests it and exports the task's artifacts from it, and checkpoints count rounds
(`[checkpoint] every_steps`). Checkpoints are taken at round boundaries (parts:
the global model, the server optimizer, the client totals); since every random
draw of a round is seeded by (train.seed, round, client), a resumed run repeats
the rounds exactly.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterator
from typing import Any

import torch

from shoal.checkpoint.parts import Custom, StatePart
from shoal.comm.links import CommGroup
from shoal.errors import JobFailed, ShoalError
from shoal.runtime.queue import SharedQueue
from shoal.runtime.rng import seed_everything
from shoal.runtime.stop import STOP
from shoal.shape.roles import RankRoles, longest_first
from shoal.strategies.federated import exact, privacy, secure
from shoal.strategies.federated.aggregation import AGGREGATIONS, FedAvg
from shoal.strategies.federated.client import ClientDropped, ClientReport, ClientRunner
from shoal.strategies.federated.config import FederatedStrategyConfig
from shoal.strategies.federated.partition import client_shards
from shoal.strategies.federated.selection import select_clients
from shoal.strategies.federated.vector import ModelVector
from shoal.strategies.federated.wire import WireAudit
from shoal.training.faults import maybe_inject_fault
from shoal.training.loop import ModelOfRecord, Plan, Run, UnitLoop
from shoal.training.meter import PHASES, RankPhases
from shoal.training.optim import build_optimizer
from shoal.training.steps import LocalModel

OK, FAILED, TIMED_OUT = 1, 2, 3
#: a round's per-worker phases: the step loop's, and the rest of the round
ROUND_PHASES = (*PHASES.values(), "other_s")
STATUS_NAMES = {FAILED: "failed", TIMED_OUT: "timed_out"}


class RoundFailed(JobFailed):
    """Fewer than `min_clients` clients reported in a round."""


class FederatedLoop(UnitLoop):
    """The round loop on one worker: its hosted clients, the global model, the server step."""

    def __init__(
        self,
        run: Run,
        config: FederatedStrategyConfig,
        roles: RankRoles,
        wire: CommGroup,
        detail: str,
    ) -> None:
        """`wire`: the group every tensor of this loop crosses (counted, audited)."""
        super().__init__(run)
        self.config, self.roles, self.detail = config, roles, detail
        self.wire = wire
        self.audit = WireAudit() if config.audit_wire else None
        wire.audit = self.audit
        ctx, cfg, task, train = self.ctx, self.config, self.task, self.ctx.config.train
        seed_everything(train.seed)  # the same initial global model on every worker
        self.model = task.build_model().to(ctx.device)
        self.vector = ModelVector(self.model)
        self.x = self.vector.read()
        self.aggregation: FedAvg = AGGREGATIONS.load(cfg.aggregation.method)(
            cfg.aggregation, self.vector.size
        )
        self.runner = ClientRunner(task, self.vector, self.model, self.aggregation, train, cfg)
        self._place_clients()
        self.sum_names = self._probe_sums()
        # the first optimizer built in a process imports torch's compile machinery (about a
        # second): pay that now, not inside the first round's deadline
        build_optimizer(self.model.parameters(), train.optimizer)
        self.seeds: dict[int, dict[int, bytes]] = {}
        if cfg.privacy.secure_aggregation:
            self.seeds = self._agree_on_pair_seeds()
        self.totals = {"client_updates": 0, "dropped": 0}
        self.record = LocalModel(ctx, self.model)
        self.plan = Plan(
            unit="round",
            total=cfg.rounds,
            eval_every=cfg.eval_every_rounds or None,
            line=(
                f"training {ctx.config.task.type} with {self.detail}: {cfg.rounds} rounds, "
                + (
                    "each worker takes the next client from a shared queue, "
                    if self.queue is not None
                    else f"clients {self.hosted} hosted here "
                    f"({[len(self.shards[c]) for c in self.hosted]} samples), "
                )
                + f"{self.vector.size} values per update"
            ),
        )

    def _place_clients(self) -> None:
        """Which clients this worker runs (`strategy.balance`), and their shards.

        static: client c on worker c mod workers. balanced: every worker computes every
        client's expected work (local steps x samples per step) and the same longest-first
        placement. dynamic: any worker may run any client, so it holds every shard, and
        takes the round's clients from a queue in the job's store.
        """
        ctx, cfg, n = self.ctx, self.config, self.config.num_clients
        balance = cfg.balance if ctx.world_size > 1 else "static"
        self.queue = SharedQueue("federated") if balance == "dynamic" else None
        if balance == "static":
            self.hosted = self.roles.hosted_by(ctx.rank)
            self.shards = client_shards(cfg.partition, self.task, n, self.hosted)
            self.work = [0.0] * n
            return
        shards = client_shards(cfg.partition, self.task, n, list(range(n)))
        batch = ctx.config.train.batch_size
        self.work = [
            float(self.runner.local_steps(len(shards[c])) * min(batch, len(shards[c])))
            for c in range(n)
        ]
        if balance == "dynamic":
            self.hosted, self.shards = list(range(n)), shards
            return
        self.roles = self.roles.placed(longest_first(self.work, [1.0] * ctx.world_size))
        self.hosted = self.roles.hosted_by(ctx.rank)
        self.shards = {c: shards[c] for c in self.hosted}
        loads = [sum(self.work[c] for c in self.roles.hosted_by(r)) for r in self.roles.workers]
        ctx.log.info(
            "clients placed by expected work (longest first): %s; sample-steps per worker %s",
            self.roles.describe(),
            [int(load) for load in loads],
        )

    def _round_clients(self, rnd: int, selected: list[int]) -> Iterator[int]:
        """The selected clients this worker runs in round `rnd`, one at a time: its hosted
        ones, or (dynamic) the next of the round's clients, longest first, until none is left."""
        if self.queue is None:
            yield from (c for c in selected if c in self.shards)
            return
        order = sorted(selected, key=lambda c: (-self.work[c], c))
        while (position := self.queue.take(f"round-{rnd}")) < len(order):
            yield order[position]

    def _probe_sums(self) -> list[str]:
        """The names of the task's additive statistics (e.g. accuracy), the same on every worker.

        Learnt from the loss of one sample with the model in evaluation mode and the global
        RNG put back: in training mode a BatchNorm layer refuses a batch of one ("Expected
        more than 1 value per channel") and would count it into its running statistics,
        and dropout would draw from the RNG the first round's training draws from."""
        training = self.model.training
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                self.model.eval()
                out = self.task.loss(self.model, self.task.train_batch(torch.tensor([0])))
        finally:
            self.model.train(training)
        return sorted(out.sums)

    def _agree_on_pair_seeds(self) -> dict[int, dict[int, bytes]]:
        """Diffie-Hellman: hosted clients publish public keys; each pair derives its own seed."""
        n = self.config.num_clients
        keys = {c: secure.KeyPair() for c in self.hosted}
        table = torch.zeros(n, secure.KEY_BYTES, dtype=torch.uint8)
        for client, pair in keys.items():
            table[client] = torch.frombuffer(bytearray(pair.public_bytes()), dtype=torch.uint8)
        gathered = self.wire.all_gather(table, "public_keys")
        public = {c: bytes(gathered[self.roles.owner(c)][c].numpy().tobytes()) for c in range(n)}
        return {
            c: {peer: pair.shared_seed(public[peer]) for peer in range(n) if peer != c}
            for c, pair in keys.items()
        }

    # ---------------------------------------------------------------- state
    def state_parts(self) -> dict[str, StatePart]:
        """The global model (x follows it on load), the server optimizer, the client totals."""
        return {
            "model": Custom(self.model.state_dict, self._load_model),
            "server": self.aggregation,
            "federated": Custom(lambda: dict(self.totals), self.totals.update),
        }

    def _load_model(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)
        self.x = self.vector.read()

    def model_of_record(self) -> ModelOfRecord:
        return self.record

    # ---------------------------------------------------------------- the units
    def done(self) -> bool:
        return self.progress.global_step >= self.config.rounds

    def run_unit(self) -> bool:
        rnd = self.progress.global_step
        undo_fault = maybe_inject_fault(self.ctx, rnd)
        try:
            self._round(rnd)
        finally:
            undo_fault()
        self.progress.global_step = rnd + 1
        self.run.reporter.update(rnd + 1, 0)
        return False

    def agree_stop(self) -> int:
        """At the round boundary, alike on every worker (counted and audited by the wire)."""
        return STOP.agree(self.ctx, lambda t: self.wire.all_reduce_sum(t, "stop_request"))

    def section(self) -> dict[str, Any]:
        return {
            "rounds": self.progress.global_step,
            "num_clients": self.config.num_clients,
            "client_updates": self.totals["client_updates"],
            "dropped_clients": self.totals["dropped"],
        }

    def close(self) -> None:
        if self.audit is not None:
            self.audit.save(self.ctx.paths.logs / f"wire-rank-{self.ctx.rank}.pt")

    # ---------------------------------------------------------------- a round
    def _round(self, rnd: int) -> None:
        ctx, cfg = self.ctx, self.config
        started = time.perf_counter()
        self.phases = RankPhases(ROUND_PHASES)
        selected = select_clients(cfg, ctx.config.train.seed, rnd)
        deadline = time.monotonic() + cfg.round_timeout_s if cfg.round_timeout_s else None
        faults = {f.client: f for f in cfg.inject if f.round == rnd}
        n, workers = cfg.num_clients, ctx.world_size
        status = torch.zeros(n, dtype=torch.float64)
        ran = torch.zeros(n, dtype=torch.float64)  # how many times each client ran (once!)
        busy = torch.zeros(2 * workers, dtype=torch.float64)  # each worker's seconds, clients
        reports: dict[int, ClientReport] = {}
        for client in self._round_clients(rnd, selected):
            ran[client] += 1
            client_started = time.perf_counter()
            try:
                reports[client] = self.runner.run(
                    client,
                    self.shards[client],
                    rnd,
                    self.x,
                    deadline,
                    faults.get(client),
                    self.phases,
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
            busy[ctx.rank] += time.perf_counter() - client_started
            busy[workers + ctx.rank] += 1
            if ctx.heartbeat is not None:
                ctx.heartbeat.beat(self.progress.global_step)

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
        shared = torch.cat([status, ran, busy, torch.tensor(stats, dtype=torch.float64)])
        waited = time.perf_counter()
        self.wire.all_reduce_sum(shared, "round_status")
        self.phases.add("comm_s", time.perf_counter() - waited)
        status = shared[:n].round().long()
        runs = shared[n : 2 * n].round().long()
        twice = [c for c in selected if runs[c] > 1]
        missed = [c for c in selected if runs[c] == 0]
        if twice or missed:
            raise RoundFailed(
                f"round {rnd}: selected clients ran more than once ({twice}) or never "
                f"({missed}): the job's store handed out positions of the round's queue "
                "wrongly (did another process write to it?); resume from the newest checkpoint"
            )
        busy = shared[2 * n : 2 * n + 2 * workers]
        shared = shared[2 * n + 2 * workers :]
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
        stepped = time.perf_counter()
        self.aggregation.server_step(self.x, delta)
        self.vector.write(self.x)
        self.phases.add("optimizer_s", time.perf_counter() - stepped)
        self._log_round(rnd, started, selected, reported, dropped, shared, delta, busy)

    def _worker_phases(self, started: float) -> tuple[float, dict[str, float]]:
        """This worker's round so far (seconds) and every worker's phases of this round
        (`rank<r>_<phase>` seconds, peak memory): the rest of its round is `other`, so
        a worker's phases add up to its own round. One small all-reduce of the figures."""
        elapsed = time.perf_counter() - started
        self.phases.add("other_s", max(elapsed - self.phases.total, 0.0))
        slots = torch.tensor(self.phases.slots(self.ctx), dtype=torch.float64)
        self.wire.all_reduce_sum(slots, "round_phases")
        return elapsed, self.phases.read(slots.tolist(), self.ctx.world_size)

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
        if dp is not None:  # the noise's sum has std sigma * C: allow 10 of those on top
            magnitude += 10 * dp.noise_multiplier * dp.clip_norm * (1 << secure.FRACTION_BITS)
        if not cfg.privacy.secure_aggregation:  # exact: the same sum in any order
            k = exact.exponent(magnitude / (1 << secure.FRACTION_BITS))
            local = torch.zeros(size, dtype=torch.int64)
            for vector in vectors.values():
                local += exact.to_fixed(vector, k)
            self._reduce_update(local, "model_update")
            return exact.from_fixed(local, k)
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
        self._reduce_update(local, "masked_model_update")
        return secure.decode(local)

    def _reduce_update(self, local: torch.Tensor, what: str) -> None:
        """The update's all-reduce, timed as the round's communication wait."""
        started = time.perf_counter()
        self.wire.all_reduce_sum(local, what)
        self.phases.add("comm_s", time.perf_counter() - started)

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
        busy: torch.Tensor,
    ) -> None:
        """`shared`: the round's statistics summed over the workers; `busy`: each worker's
        seconds in its clients, then how many clients it ran."""
        cfg = self.config
        stats = shared.tolist()
        loss_sum, trained = stats[0], max(stats[1], 1.0)
        sums = dict(zip(self.sum_names, stats[2 : 2 + len(self.sum_names)], strict=True))
        norm_sum, clipped = stats[2 + len(self.sum_names)], stats[3 + len(self.sum_names)]
        model_bytes = self.vector.size * 4
        round_s, phases = self._worker_phases(started)  # before the wire's counts: they include it
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
            "round_s": round_s,  # this worker's (rank 0's), as its phases
            **phases,
            "worker_busy_s": busy[: len(busy) // 2].tolist(),
            "worker_clients": [int(c) for c in busy[len(busy) // 2 :]],
        }
        record["samples"] = stats[1]  # the samples the reporting clients trained on
        record["samples_per_s"] = stats[1] / max(record["round_s"], 1e-9)
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
        figures = {"loss": record["loss"], **{k: record[f"train_{k}"] for k in sums}}
        self.run.logged_train(figures, rnd + 1)
        self.run.metrics.write(record)
        drops = f", {record['dropped']} dropped" if record["dropped"] else ""
        self.run.reporter.note(
            f"round {rnd + 1}/{cfg.rounds}: {len(reported)}/{len(selected)} clients{drops}, "
            f"loss {record['loss']:.4f}, update norm {record['update_norm']:.4f}, "
            f"{record['round_s']:.2f} s"
        )
        if record["dropped"]:
            self.ctx.log.info("round %d: dropped %s", rnd, dropped)
