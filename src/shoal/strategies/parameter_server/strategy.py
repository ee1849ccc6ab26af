"""`parameter_server`: the roles of the ranks, and how each runs.

Placement `dedicated`: ranks 0..W-1 are workers, ranks W..W+S-1 servers.
Placement `colocated`: every rank is a worker, and S of them also run a server
on a thread of their own: dealt over the hosts in turn (the config's
`server_ranks`), so
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
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from shoal.comm.links import CommGroup, PairGroups
from shoal.errors import ShoalError
from shoal.protocols.capabilities import SERVED_TABLES, ServedTables
from shoal.protocols.task import Task
from shoal.runtime.collectives import all_reduce_sum
from shoal.runtime.memory import PeakGrowth
from shoal.runtime.rng import seed_everything
from shoal.strategies.base import Strategy
from shoal.strategies.parameter_server.client import RowClient
from shoal.strategies.parameter_server.config import ParameterServerStrategyConfig
from shoal.strategies.parameter_server.endpoint import ServerEndpoint
from shoal.strategies.parameter_server.host_rows import (
    SHARED_MEMORY_DIR,
    HostShard,
    SharedStorage,
    description,
    room_for,
    store_key,
    wait_for_key,
)
from shoal.strategies.parameter_server.learner import ServedRows, ServerSync
from shoal.strategies.parameter_server.rejoin import (
    Announcement,
    Rejoin,
    Watcher,
    announce,
    pairs_prefix,
)
from shoal.strategies.parameter_server.row_optimizers import build_row_optimizer
from shoal.strategies.parameter_server.server import ShardServer
from shoal.strategies.parameter_server.sharding import owner_positions, table_owners
from shoal.strategies.parameter_server.shards import build_shard, load_shards
from shoal.strategies.parameter_server.storage import FileStorage, MemoryStorage, ShardStorage
from shoal.strategies.parameter_server.transport import (
    Link,
    LocalChannel,
    LocalLink,
    RemoteLink,
)
from shoal.strategies.parameter_server.worker_loop import ServedStepLoop
from shoal.training.contracts import GradientSync
from shoal.training.faults import maybe_inject_fault

MIB = 1 << 20


class ParameterServerStrategy(Strategy[ParameterServerStrategyConfig]):
    """Workers pull the rows each batch touches and push their gradients to sharded servers."""

    config_class: ClassVar[type[ParameterServerStrategyConfig]] = ParameterServerStrategyConfig

    client: RowClient
    tables: ServedTables

    def run(self, task: Task) -> dict[str, Any]:
        self.shared_storage: list[SharedStorage] = []
        try:
            return self._run(task)
        finally:  # a shard shared on a host leaves no file behind, however the job ends
            for storage in self.shared_storage:
                storage.unlink()

    def _run(self, task: Task) -> dict[str, Any]:
        ctx, config = self.ctx, self.config
        self.task = task
        self.tables = SERVED_TABLES.of(task, "parameter_server")
        self.owners = {
            name: table_owners(config.sharding, config.num_servers, table.labels, table.small)
            for name, table in self.tables.served_tables().items()
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
        self.tables = SERVED_TABLES.of(task, "parameter_server")
        client, served = self.client, self.served
        results = self.drive(
            task, lambda run: ServedStepLoop(run, self, client, served), worker_ctx
        )
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
        alone = any(self.shape.restarts_alone(rank)[0] for rank in self.roles.servers)
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
        growth = PeakGrowth().__enter__()  # O(rows owned): the figure says so (results.json)
        with torch.device("meta"):  # shapes and the rows' key: no table is allocated
            model = task.build_model()
        served = self.tables

        def starts(name: str) -> Callable[[torch.Tensor], torch.Tensor] | None:
            if ctx.resume_from:  # the checkpoint fills every row
                return None
            return lambda ids: served.initial_rows(model, name, ids)

        storage = self._storage(server, served.table_weights(model), optimizer)
        tables = {
            name: build_shard(
                self.owners[name], server, weight.shape[1], starts(name), optimizer, storage
            )
            for name, weight in served.table_weights(model).items()
        }
        growth.__exit__()
        widths = (tables["entity"].width, tables["relation"].width)
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
            storage,
            lambda folder, tables: load_shards(folder, server, config.num_servers, tables, ctx.log),
        )
        shard.stats.build_peak_bytes = growth.bytes
        if ctx.resume_from:
            shard.resume_at(
                load_shards(Path(ctx.resume_from), server, config.num_servers, tables, ctx.log)
            )
        if self._shares_host(server):  # b"": this server's rows go by message
            blob = b""
            if isinstance(storage, SharedStorage):
                storage.seal()
                self.shared_storage.append(storage)
                blob = description(tables, storage)
            ctx.store.set(store_key(ctx.restart, server, "rows"), blob)
        rank = self.roles.servers[server]
        host = ctx.hosts.label(ctx.hosts.host_of[rank])
        ctx.log.info("%s; host %s", describe_server(shard, config, rank), host)
        last = [-1]

        def tick(s: ShardServer) -> None:
            applied = s.applied()
            clock = int(applied) if applied != float("inf") else last[0]
            if clock != last[0]:
                first, last[0] = last[0] == -1, clock
                if ctx.heartbeat is not None and channel is None:  # the first at once
                    ctx.heartbeat.beat(clock, now=first)
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
        config = self.config
        links: list[Link] = []
        rejoin = self._rejoin()
        for server in range(config.num_servers):
            rank = self.roles.servers[server]
            if channel is not None and rank == self.ctx.rank:
                links.append(LocalLink(server, rank, channel))
            else:
                links.append(RemoteLink(server, rank, self.peers, rejoin))
        widths = self._widths()
        self.client = RowClient(
            self.ctx.rank,
            links,
            self.owners,
            widths,
            config.max_message_rows,
            self.ctx.config.faults.timeout_s,
            self._map_host_shards(),
        )
        rows = {name: table.rows for name, table in self.tables.served_tables().items()}
        self.served = ServedRows(self.client, rows["entity"], rows["relation"], self.ctx.device)
        remote = [link for link in links if isinstance(link, RemoteLink)]
        self.watcher = Watcher(rejoin, remote) if rejoin is not None else None
        self._check_budget(widths)

    # ------------------------------------------------------------ rows shared on a host
    def _host_rows_apply(self) -> str | None:
        """Why rows are not shared on hosts in this job (None: they are, where a server has
        workers on its host); `host_rows = "shared"` refuses to go on without."""
        config, ctx = self.config, self.ctx
        why = None
        if config.host_rows == "messages":
            return 'strategy.host_rows = "messages"'
        if config.mode != "async":
            why = f'mode "{config.mode}"'
        elif config.optimizer.kind == "lazy_adam":
            why = "optimizer lazy_adam"
        elif ctx.store is None:
            why = "this launch has no job store"
        elif any(self.shape.restarts_alone(rank)[0] for rank in self.roles.servers):
            why = "a server may restart alone"
        if why is not None and config.host_rows == "shared":
            raise ShoalError(f'strategy.host_rows = "shared" cannot apply here: {why}; set '
                             'host_rows = "auto" or "messages"')  # fmt: skip
        return why

    def _host_workers(self, server: int) -> list[int]:
        """The worker ranks on the host of server `server`."""
        hosts = self.ctx.hosts
        host = hosts.host_of[self.roles.servers[server]]
        return [r for r in self.roles.workers if hosts.host_of[r] == host]

    def _shares_host(self, server: int) -> bool:
        return self._host_rows_apply() is None and bool(self._host_workers(server))

    def _storage(
        self, server: int, weights: dict[str, torch.Tensor], optimizer: Any
    ) -> ShardStorage:
        """Where server `server` keeps its shard: shared with its host's workers when rows
        are shared (and the file system has room), in `shard_dir`'s files, or in memory."""
        config, ctx = self.config, self.ctx
        label = f"server-{server}"
        disk = Path(config.shard_dir) if config.shard_dir is not None else None
        if self._shares_host(server):
            parent = disk or SHARED_MEMORY_DIR
            rows = {name: int((self.owners[name] == server).sum()) for name in weights}
            per_row = {"sgd": 0, "adagrad": 1}.get(config.optimizer.kind, 0)
            need = sum(4 * n * (int(weights[name].shape[1]) + per_row) for name, n in rows.items())
            if room_for(parent, need):
                return SharedStorage(parent, label)
            if config.host_rows == "shared":
                raise ShoalError(
                    f'strategy.host_rows = "shared": server {server} needs {need / MIB:.1f} '
                    f"MiB in {parent}, which has less free; set strategy.shard_dir to a "
                    'folder with room, or host_rows = "auto"'
                )
            ctx.log.warning(
                "server %d: %s has not %.1f MiB free for its shard: its host's workers reach "
                "it by message", server, parent, need / MIB)  # fmt: skip
        if disk is not None:
            return FileStorage(disk, label)
        return MemoryStorage()

    def _map_host_shards(self) -> dict[int, HostShard]:
        """The shards of this worker's host's servers, mapped (see host_rows.py); the host's
        last worker to map a shard unlinks its files."""
        ctx = self.ctx
        why = self._host_rows_apply()
        if why is not None:
            if ctx.is_main and self.config.host_rows == "auto":
                ctx.log.info("parameter server: every row goes by message (%s)", why)
            return {}
        mapped: dict[int, HostShard] = {}
        positions = {name: owner_positions(o) for name, o in self.owners.items()}
        optimizer = build_row_optimizer(self.config.optimizer)
        host = ctx.hosts.host_of[ctx.rank]
        for server, rank in enumerate(self.roles.servers):
            if ctx.hosts.host_of[rank] != host:
                continue
            who = f"server {server} (rank {rank})"
            blob = wait_for_key(ctx.store, store_key(ctx.restart, server, "rows"),
                                ctx.config.faults.start_timeout_s, who)  # fmt: skip
            if not blob:
                continue
            shard = mapped[server] = HostShard(server, blob, positions, optimizer)
            count = int(ctx.store.add(store_key(ctx.restart, server, "mapped"), 1))
            if count == len(self._host_workers(server)):
                shard.unlink()
        if mapped:
            ctx.log.info("parameter server worker %d: reads and updates the rows of server(s) "
                         "%s in shared memory", ctx.rank, ", ".join(map(str, mapped)))  # fmt: skip
        return mapped

    def _check_budget(self, widths: tuple[int, int]) -> None:
        """The most a worker holds at once, and a check against the configured budget.

        Training: a batch's rows and the prefetched batch's, and the gradients of one.
        Evaluation: a block of candidate rows (no larger than a training batch's rows),
        the queries, and the score matrix of an evaluation batch against every entity.
        Owner arrays (4 bytes a row) besides. Fails before training if over budget.
        """
        config, tables = self.config, self.tables
        train = self.ctx.config.train
        chunk = self.task.batch_unit  # a worker's share is whole units (learner.py)
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
        entity_rows, relation_rows = tables.rows_held(share)
        batch_bytes = 4 * (entity_rows * widths[0] + relation_rows * widths[1])
        train_bytes = (3 if config.prefetch else 2) * batch_bytes
        self.served.block_rows = min(entity_rows, config.max_message_rows)
        eval_batch = tables.eval_batch_size()
        entities = self.served.num_entities
        eval_bytes = 4 * (
            eval_batch * entities
            + self.served.block_rows * widths[0]
            + 3 * eval_batch * max(widths)
        )
        owners_bytes = sum(o.nbytes for o in self.owners.values())
        self.bound_bytes = max(train_bytes, eval_bytes) + owners_bytes
        table_bytes = 4 * (entities * widths[0] + self.served.num_relations * widths[1])
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
                f"{self.bound_bytes / MIB:.3f} MiB (training: batch share {share}, "
                f"{entity_rows} entity rows, {train_bytes / MIB:.3f} MiB; "
                f"evaluation: batch {eval_batch} against {entities} entities, "
                f"{eval_bytes / MIB:.3f} MiB); lower train.batch_size or "
                "task.evaluation.batch_size, or raise num_workers or the budget"
            )

    def attach(self, model: nn.Module) -> GradientSync:
        self.tables.serve(model, self.served)
        worker_ctx = self.worker_ctx

        def reduce(values: list[float]) -> list[float]:
            return all_reduce_sum(worker_ctx, values)

        self.sync = ServerSync(self.client, reduce, self.config.num_workers, self.ctx.is_main)
        return self.sync

    def _widths(self) -> tuple[int, int]:
        """Numbers per row of the entity and relation tables (of a model on the meta device)."""
        with torch.device("meta"):
            weights = self.tables.table_weights(self.task.build_model())
        return int(weights["entity"].shape[1]), int(weights["relation"].shape[1])

    def describe(self) -> str:
        c = self.config
        bound = f", max_staleness {c.max_staleness}" if c.mode == "bounded" else ""
        return (
            f"parameter_server x{c.num_workers} workers, {c.num_servers} servers "
            f"({c.placement}, {c.sharding.kind} sharding, {c.mode}{bound}, {c.optimizer.kind})"
        )


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
        f"{size / MIB:.2f} MiB with optimizer state, {server.storage.describe()}; "
        f"{config.optimizer.kind} lr "
        f"{config.optimizer.lr:g}; mode {config.mode}{bound}; {config.sharding.kind} sharding; "
        f"{server.num_workers} workers"
    )
