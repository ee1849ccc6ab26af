"""`parameter_server`: the roles of the ranks, and how each runs.

Placement `dedicated`: ranks 0..W-1 are workers, ranks W..W+S-1 servers.
Placement `colocated`: every rank is a worker, and S of them also run a server
on a thread of their own: dealt over the hosts in turn (`server_ranks`), so
that on 2 hosts x 2 ranks servers 0 and 1 run on ranks 0 and 2, one per host.

Two process groups are made collectively by every rank at the start: one for
the servers' point-to-point traffic (a CommGroup of its own, `comm/links.py`, so
row messages never interleave with collectives) and one of the workers, on which
the trainer's collectives (metrics, evaluation, checkpoints) run.

Relations are served like entities rather than replicated and all-reduced: an
all-reduce would make every worker wait for every other each step, which is
exactly what `async` and `bounded` exist to avoid, while a batch touches few
relation rows (a relation table is small), so pulling them costs little.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from shoal.comm.links import CommGroup, PairGroups
from shoal.config.root import ShoalConfig
from shoal.errors import ConfigError, ShoalError
from shoal.runtime.collectives import all_reduce_sum
from shoal.runtime.hosts import Hosts
from shoal.runtime.rng import seed_everything
from shoal.runtime.roles import RankRoles
from shoal.strategies.base import Shrink, Strategy
from shoal.strategies.parameter_server.client import RowClient
from shoal.strategies.parameter_server.collaborators import ServedModel, ShardFiles, server_section
from shoal.strategies.parameter_server.config import ParameterServerStrategyConfig
from shoal.strategies.parameter_server.endpoint import ServerEndpoint
from shoal.strategies.parameter_server.learner import ServedRows, ServerLearner, ServerSync
from shoal.strategies.parameter_server.rejoin import (
    Announcement,
    Rejoin,
    Watcher,
    announce,
    pairs_prefix,
)
from shoal.strategies.parameter_server.row_optimizers import build_row_optimizer
from shoal.strategies.parameter_server.server import ShardServer
from shoal.strategies.parameter_server.sharding import table_owners
from shoal.strategies.parameter_server.shards import build_shard, load_shards
from shoal.strategies.parameter_server.transport import (
    Link,
    LocalChannel,
    LocalLink,
    RemoteLink,
)
from shoal.tasks.base import Task
from shoal.tasks.kge.config import KGETaskConfig
from shoal.tasks.kge.models import KGEModel
from shoal.tasks.kge.task import KGETask
from shoal.tasks.kge.training_types import unserved_reason
from shoal.training.contracts import GradientSync
from shoal.training.faults import maybe_inject_fault
from shoal.training.steps import StepCollaborators, StepLoop

MIB = 1 << 20


class ParameterServerStrategy(Strategy):
    """Workers pull the rows each batch touches and push their gradients to sharded servers."""

    config_class: ClassVar[type[ParameterServerStrategyConfig]] = ParameterServerStrategyConfig

    workers_field: ClassVar[str | None] = "num_workers"
    # shard files re-shard on resume; the rows' optimizer state is of one kind
    resume_safe: ClassVar[tuple[str, ...]] = (
        "num_servers",
        "min_servers",
        "placement",
        "sharding.*",
        "barrier_timeout_s",
        "prefetch",
        "max_message_rows",
        "worker_memory_budget_mb",
    )
    resume_incompatible: ClassVar[tuple[str, ...]] = ("optimizer.kind",)
    #: sync mode splits each global batch over the workers and sums their pushes, so fewer
    #: workers train the same problem; the shard files re-shard over fewer servers
    elastic: ClassVar[bool] = True
    client: RowClient

    @classmethod
    def world_size(cls, config: ShoalConfig) -> int:
        assert isinstance(config.strategy, ParameterServerStrategyConfig)
        return config.strategy.world_size

    @classmethod
    def members(cls, config: ShoalConfig) -> dict[str, int]:
        c = config.strategy
        assert isinstance(c, ParameterServerStrategyConfig)
        return {"workers": c.num_workers, "servers": c.num_servers}

    @classmethod
    def workers_in(cls, config: ShoalConfig, world_size: int) -> int:
        """Dedicated servers are ranks but not workers (a checkpoint counts the workers)."""
        c = config.strategy
        assert isinstance(c, ParameterServerStrategyConfig)
        return world_size - (c.num_servers if c.placement == "dedicated" else 0)

    @classmethod
    def fit_world(cls, config: ShoalConfig, world_size: int, section: str) -> list[str]:
        """The roles of `world_size` processes (torchrun's world after a host was lost or
        came back). Dedicated: the configured servers stay while enough ranks are left for
        `max(1, faults.min_workers)` workers (else fewer servers, down to
        `strategy.min_servers`), and workers fill the rest; colocated: every process is a
        worker, with at most as many servers. Resuming re-shards the tables over the servers
        (`load_shards`); a worker's share is whole chunks, so any count trains the same."""
        c = config.strategy
        assert isinstance(c, ParameterServerStrategyConfig)
        if world_size == c.world_size:
            return []
        if c.placement == "colocated":
            workers, servers = world_size, min(c.num_servers, world_size)
        else:
            needed = max(1, config.faults.min_workers)
            servers = max(min(c.num_servers, world_size - needed), c.min_servers)
            workers = world_size - servers
            if workers < 1:
                raise ConfigError(
                    f"{section}: {world_size} processes started, and a parameter-server job "
                    f"needs strategy.min_servers ({c.min_servers}) dedicated servers and a "
                    f"worker; start at least {c.min_servers + 1}"
                )
        overrides = [f"{section}.num_workers={workers}", f"{section}.num_servers={servers}"]
        if c.min_servers > servers:
            overrides.append(f"{section}.min_servers={servers}")
        return overrides

    @classmethod
    def without_rank(cls, config: ShoalConfig, rank: int, section: str) -> Shrink | None:
        """Elastic membership, two floors. A worker given up: one worker fewer, down to
        `faults.min_workers` (which counts workers only), the same global batch (each
        worker trains its share of it, and sync mode sums the shares' pushes); co-located
        servers never outnumber the workers left. A dedicated server given up: one server
        fewer, down to `strategy.min_servers`; every server of the next attempt reads the
        rows it now owns, with their row-optimizer state, from every shard file of the
        checkpoint it resumes from (shards.py: `load_shards` re-shards)."""
        c = config.strategy
        assert isinstance(c, ParameterServerStrategyConfig)
        if c.placement == "dedicated" and rank >= c.num_workers:
            servers = c.num_servers - 1
            if servers < c.min_servers:
                return None
            return Shrink(
                [f"{section}.num_servers={servers}"],
                {"workers": c.num_workers, "servers": servers},
                f"strategy.min_servers = {c.min_servers}",
            )
        workers = c.num_workers - 1
        if workers < config.faults.min_workers:
            return None
        servers = c.num_servers if c.placement == "dedicated" else min(c.num_servers, workers)
        overrides = [f"{section}.num_workers={workers}"]
        if servers != c.num_servers:
            overrides.append(f"{section}.num_servers={servers}")
        if c.min_servers > servers:
            overrides.append(f"{section}.min_servers={servers}")
        return Shrink(
            overrides,
            {"workers": workers, "servers": servers},
            f"faults.min_workers = {config.faults.min_workers}",
        )

    @classmethod
    def restarts_alone(cls, config: ShoalConfig, rank: int) -> tuple[bool, str | None]:
        """A dedicated server, under `faults.max_restarts` (rejoin.py); a co-located one
        shares a worker's process, whose state died with it."""
        c = config.strategy
        assert isinstance(c, ParameterServerStrategyConfig)
        if not config.faults.max_restarts:
            return False, None
        if c.placement == "dedicated":
            return rank >= c.num_workers, None
        if rank in server_ranks(c, Hosts.single(c.world_size)):  # the launcher's: one host
            return False, (
                f"rank {rank} runs a worker beside its server (placement colocated): its "
                "worker's state died with it, so every rank restarts"
            )
        return False, None

    @classmethod
    def check(cls, config: ShoalConfig) -> None:
        if config.task.type != "kge":
            raise ConfigError(
                f"strategy parameter_server serves embedding tables: it trains task type "
                f"'kge', not {config.task.type!r}; use data_parallel for dense models"
            )
        assert isinstance(config.task, KGETaskConfig)
        reason = unserved_reason(config.task)
        if reason is not None:
            raise ConfigError(f"strategy parameter_server cannot train {reason}")

    @property
    def config(self) -> ParameterServerStrategyConfig:
        config = self.ctx.config.strategy
        assert isinstance(config, ParameterServerStrategyConfig)
        return config

    # ------------------------------------------------------------ roles
    def make_roles(self) -> RankRoles:
        c = self.config
        dedicated = c.placement == "dedicated"
        return RankRoles.parameter_server(c.num_workers, server_ranks(c, self.ctx.hosts), dedicated)

    def run(self, task: Task) -> dict[str, Any]:
        if not isinstance(task, KGETask):
            raise ShoalError("strategy parameter_server trains task type 'kge'")
        ctx, config = self.ctx, self.config
        self.task = task
        self.owners = {
            "entity": table_owners(
                config.sharding, config.num_servers, task.data.entities.labels, False
            ),
            "relation": table_owners(
                config.sharding, config.num_servers, task.relation_labels, True
            ),
        }
        server = self.roles.server_of(ctx.rank)
        if ctx.rejoin:
            assert server is not None and not self.roles.is_worker(ctx.rank)
            return self._serve_again(server)
        timeout = datetime.timedelta(seconds=ctx.config.faults.timeout_s)
        self.peers = self.comm_group(backend="gloo")  # collective: all ranks
        worker_ranks = list(self.roles.workers)
        workers_group = dist.new_group(ranks=worker_ranks, timeout=timeout)
        if not self.roles.is_worker(ctx.rank):  # a dedicated server
            assert server is not None
            self._endpoint(server, None).serve()
            return {"status": "completed", "role": f"server {server}"}
        channel = LocalChannel(ctx.rank) if server is not None else None
        thread = None
        if server is not None:
            endpoint = self._endpoint(server, channel)
            failure: list[BaseException] = []

            def serve() -> None:
                try:
                    endpoint.serve()
                except BaseException as exc:  # reported by the worker thread below
                    failure.append(exc)
                    ctx.log.error("server %d failed: %s", server, exc)

            thread = threading.Thread(target=serve, name=f"ps-server-{server}", daemon=True)
            thread.start()
        self._start_worker(channel)
        # the workers' collectives (metrics, evaluation, checkpoints) run on their own group
        worker_ctx = dataclasses.replace(ctx, world_size=config.num_workers, group=workers_group)
        self.worker_ctx = worker_ctx
        task = self.task = task.on(worker_ctx)
        collaborators = StepCollaborators(
            build_model=_served_model_shapes(task),
            make_learner=self.make_learner,
            model_of_record=lambda learner, progress: ServedModel(
                worker_ctx, self.client, learner.model, progress
            ),
            files=lambda progress: [ShardFiles(worker_ctx, self.client, progress)],
            after_restore=self.resume_clock,
            section=lambda progress: server_section(
                worker_ctx, self.client, self.describe(), self.config.mode, progress
            ),
        )
        loop = StepLoop(worker_ctx, task, self, collaborators)
        results = self.drive(task, loop, worker_ctx)
        if self.watcher is not None:
            self.watcher.stop()
        self.client.bye()
        if thread is not None:
            thread.join(timeout=ctx.config.faults.timeout_s)
            if failure:
                raise failure[0]
        return results

    # ------------------------------------------------------------ the server side
    def _serve_again(self, server: int) -> dict[str, Any]:
        """A dedicated server restarted alone (rejoin.py): its state from the newest the
        launcher found (`--resume`, else the job's start), then pairs to each worker under
        this restart's prefix, announced in the store with the clock of that state."""
        ctx = self.ctx
        timeout_s = ctx.config.faults.timeout_s
        pairs = PairGroups(ctx.store, pairs_prefix(server, ctx.restart), ctx.rank, timeout_s)
        self.peers = CommGroup(ctx.rank, ctx.world_size, ctx.hosts, timeout_s, pairs=pairs)
        endpoint = self._endpoint(server, None)
        clock = min(endpoint.server.received)
        announce(ctx.store, server, Announcement(ctx.restart, clock))
        ctx.log.info(
            "server %d restarted alone at clock %d (restart %d): the workers reconnect and "
            "send again their pushes since then",
            server,
            clock,
            ctx.restart,
        )
        endpoint.serve()
        return {"status": "completed", "role": f"server {server}"}

    def _rejoin(self) -> Rejoin | None:
        """A worker's means to reconnect to a server restarted alone (None: a dead server
        ends the job, as every rank is then restarted or none is)."""
        ctx = self.ctx
        alone = any(self.restarts_alone(ctx.config, rank)[0] for rank in self.roles.servers)
        if not alone or ctx.store is None or ctx.launch_mode != "shoal":
            return None
        faults = ctx.config.faults
        return Rejoin(
            ctx.store, ctx.rank, ctx.hosts, faults.start_timeout_s, faults.timeout_s, ctx.log
        )

    def _endpoint(self, server: int, channel: LocalChannel | None) -> ServerEndpoint:
        ctx, config, task = self.ctx, self.config, self.task
        optimizer = build_row_optimizer(config.optimizer)
        seed_everything(ctx.config.train.seed)  # the initial tables of every other strategy
        full = task.build_model()
        assert isinstance(full, KGEModel)
        tables = {
            "entity": build_shard(self.owners["entity"], server, full.entity.weight, optimizer),
            "relation": build_shard(
                self.owners["relation"], server, full.relation.weight, optimizer
            ),
        }
        widths = (tables["entity"].width, tables["relation"].width)
        del full
        shard = ShardServer(
            server,
            config.num_servers,
            config.num_workers,
            tables,
            optimizer,
            config.mode,
            config.staleness_bound,
            config.barrier_timeout_s,
            ctx.paths.root,
            ctx.log,
            lambda folder, tables: load_shards(folder, server, config.num_servers, tables, ctx.log),
        )
        if ctx.resume_from:
            shard.resume_at(
                load_shards(Path(ctx.resume_from), server, config.num_servers, tables, ctx.log)
            )
        rank = self.roles.servers[server]
        host = ctx.hosts.label(ctx.hosts.host_of[rank])
        ctx.log.info("%s; host %s", describe_server(shard, config, rank), host)
        last = [-1]

        def tick(s: ShardServer) -> None:
            applied = s.applied()
            clock = int(applied) if applied != float("inf") else last[0]
            if clock != last[0]:
                last[0] = clock
                if ctx.heartbeat is not None and channel is None:
                    ctx.heartbeat.beat(clock)
                maybe_inject_fault(ctx, clock)

        return ServerEndpoint(
            shard,
            # a view of the group of its own: the server's bytes are not its worker's
            dataclasses.replace(self.peers, sent_bytes=0, received_bytes=0),
            widths,
            config.max_message_rows,
            ctx.log,
            channel,
            tick if channel is None else None,
        )

    # ------------------------------------------------------------ the worker side
    def _start_worker(self, channel: LocalChannel | None) -> None:
        config, task = self.config, self.task
        links: list[Link] = []
        rejoin = self._rejoin()
        for server in range(config.num_servers):
            rank = self.roles.servers[server]
            if channel is not None and rank == self.ctx.rank:
                links.append(LocalLink(server, rank, channel))
            else:
                links.append(RemoteLink(server, rank, self.peers, rejoin))
        widths = _widths(task)
        self.client = RowClient(
            self.ctx.rank,
            links,
            self.owners,
            widths,
            config.max_message_rows,
            self.ctx.config.faults.timeout_s,
        )
        self.served = ServedRows(self.client, self.task.num_entities, self.task.relation_rows)
        remote = [link for link in links if isinstance(link, RemoteLink)]
        self.watcher = Watcher(rejoin, remote) if rejoin is not None else None
        self._check_budget(widths)

    def _check_budget(self, widths: tuple[int, int]) -> None:
        """The most a worker holds at once, and a check against the configured budget.

        Training: a batch's rows and the prefetched batch's, and the gradients of one.
        Evaluation: a block of candidate rows (no larger than a training batch's rows),
        the queries, and the score matrix of an evaluation batch against every entity.
        Owner arrays (4 bytes a row) besides. Fails before training if over budget.
        """
        config, task = self.config, self.task
        train = self.ctx.config.train
        negatives = task.config.negatives
        chunk = negatives.chunk_size  # a worker's share is whole chunks (learner.py)
        in_batch = math.ceil(train.batch_size / chunk)
        if in_batch < config.num_workers and self.ctx.rank == 0:
            self.ctx.log.warning(
                "task.negatives.chunk_size = %d: a batch of %d (train.batch_size) is %d "
                "chunk(s), fewer than the %d workers, so %d worker(s) train nothing in a step "
                "(a worker's share is whole chunks); lower chunk_size or raise batch_size",
                chunk,
                train.batch_size,
                in_batch,
                config.num_workers,
                config.num_workers - in_batch,
            )
        chunks = math.ceil(in_batch / config.num_workers)
        share = min(train.batch_size, chunks * chunk)
        per_chunk = sum(count for _, count in negatives.side_counts)
        entity_rows = min(task.num_entities, 2 * share + chunks * per_chunk)
        relation_rows = min(task.relation_rows, 2 * share)
        batch_bytes = 4 * (entity_rows * widths[0] + relation_rows * widths[1])
        train_bytes = (3 if config.prefetch else 2) * batch_bytes
        self.served.block_rows = min(entity_rows, config.max_message_rows)
        eval_batch = task.config.evaluation.batch_size
        eval_bytes = 4 * (
            eval_batch * task.num_entities
            + self.served.block_rows * widths[0]
            + 3 * eval_batch * max(widths)
        )
        owners_bytes = sum(o.nbytes for o in self.owners.values())
        self.bound_bytes = max(train_bytes, eval_bytes) + owners_bytes
        table_bytes = 4 * (task.num_entities * widths[0] + task.relation_rows * widths[1])
        self.ctx.log.info(
            "parameter server worker %d: holds at most %.3f MiB of rows and scores "
            "(the tables: %.3f MiB)",
            self.ctx.rank,
            self.bound_bytes / MIB,
            table_bytes / MIB,
        )
        budget = config.worker_memory_budget_mb
        if budget is not None and self.bound_bytes > budget * MIB:
            raise ShoalError(
                f"strategy.worker_memory_budget_mb = {budget:g}: a worker would hold up to "
                f"{self.bound_bytes / MIB:.3f} MiB (training: batch share {share} with "
                f"{per_chunk} negatives per chunk, {train_bytes / MIB:.3f} MiB; "
                f"evaluation: batch {eval_batch} against {task.num_entities} entities, "
                f"{eval_bytes / MIB:.3f} MiB); lower train.batch_size or "
                "task.evaluation.batch_size, or raise num_workers or the budget"
            )

    def attach(self, model: nn.Module) -> GradientSync:
        assert isinstance(model, KGEModel)
        model.serve_tables(self.served)
        worker_ctx = self.worker_ctx

        def reduce(values: list[float]) -> list[float]:
            return all_reduce_sum(worker_ctx, values)

        self.sync = ServerSync(self.client, reduce, self.config.num_workers, self.ctx.is_main)
        return self.sync

    def make_learner(self, model: nn.Module, sync: GradientSync, total_steps: int) -> ServerLearner:
        assert isinstance(sync, ServerSync)
        learner = ServerLearner(
            self.task,
            model,
            sync,
            self.served,
            self.ctx.config.train,
            self.config,
            (self.ctx.rank, self.config.num_workers),
        )
        learner.total_steps = total_steps
        return learner

    def resume_clock(self, step: int) -> None:
        self.client.resume_at(step)
        self.served.clock = step

    def describe(self) -> str:
        c = self.config
        bound = f", max_staleness {c.max_staleness}" if c.mode == "bounded" else ""
        return (
            f"parameter_server x{c.num_workers} workers, {c.num_servers} servers "
            f"({c.placement}, {c.sharding.kind} sharding, {c.mode}{bound}, {c.optimizer.kind})"
        )


def _served_model_shapes(task: KGETask) -> Callable[[], nn.Module]:
    """The worker's model: the shapes only, built on the meta device (the rows live on the
    servers; `attach` serves them)."""

    def build() -> nn.Module:
        with torch.device("meta"):
            return task.build_model()

    return build


def server_ranks(config: ParameterServerStrategyConfig, hosts: Hosts) -> list[int]:
    """The rank that runs each server.

    dedicated: ranks W..W+S-1. colocated by host: the first rank of every host in
    host order, then the second rank of every host, ... (on one host: ranks
    0..S-1), so the tables and the pulls they serve are spread over the machines.
    """
    count = config.num_servers
    if config.placement == "dedicated":
        return list(range(config.num_workers, config.num_workers + count))
    if not config.colocate_by_host:
        return list(range(count))
    groups = [[r for r in ranks if r < config.num_workers] for ranks in hosts.groups]
    dealt = [r for tier in itertools.zip_longest(*groups) for r in tier if r is not None]
    return dealt[:count]


def _widths(task: KGETask) -> tuple[int, int]:
    with torch.device("meta"):
        model = task.build_model()
    assert isinstance(model, KGEModel)
    return int(model.entity.weight.shape[1]), int(model.relation.weight.shape[1])


def describe_server(server: ShardServer, config: ParameterServerStrategyConfig, rank: int) -> str:
    """One line: who the server is, what it holds, how it updates (the seeds' describe_server)."""
    tables = ", ".join(
        f"{name} {len(t.ids)}/{len(t.index)} rows x {t.width}" for name, t in server.tables.items()
    )
    size = sum(
        t.rows.numel() * 4 + sum(s.numel() * 4 for s in t.state.values())
        for t in server.tables.values()
    )
    bound = f" (max_staleness {config.max_staleness})" if config.mode == "bounded" else ""
    return (
        f"parameter server {server.index} of {server.num_servers} on rank {rank}: {tables}; "
        f"{size / MIB:.2f} MiB with optimizer state; {config.optimizer.kind} lr "
        f"{config.optimizer.lr:g}; mode {config.mode}{bound}; {config.sharding.kind} sharding; "
        f"{server.num_workers} workers"
    )
