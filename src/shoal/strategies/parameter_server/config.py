"""`[strategy] type = "parameter_server"`: servers, placement, sharding, consistency, optimizer.

Variants are unions discriminated by `kind` (sharding, server optimizer). Checks
that span sections (the server optimizer replaces `train.optimizer`'s schedule;
the barrier timeout must fit inside the collective timeout) are its `check`,
which the root config calls once every section is valid.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from shoal.config.base import (
    RESUME_FIXED,
    RESUME_SAFE,
    ConfigModel,
    ExistingFile,
    FieldError,
    StrategySection,
    fill_default_tag,
)
from shoal.errors import ConfigError
from shoal.protocols.capabilities import SERVED_TABLES
from shoal.shape.hosts import Hosts
from shoal.shape.job import JobShape, Shrink
from shoal.shape.roles import RankRoles

if TYPE_CHECKING:
    from shoal.config.root import ShoalConfig

# ---------------------------------------------------------------- sharding


class HashShardingConfig(ConfigModel):
    """Row id -> server by a mixing hash of the id: balanced whatever the id order."""

    kind: Literal["hash"] = "hash"


class RangeShardingConfig(ConfigModel):
    """Contiguous id ranges of (almost) equal size, server 0 first."""

    kind: Literal["range"] = "range"


class FileShardingConfig(ConfigModel):
    """A user partition of the entities: a file of `entity<TAB>server` lines.

    Every training entity must be listed once; relations are hashed.
    """

    kind: Literal["file"] = "file"
    path: ExistingFile = Field(description="The partition file (relative to the config file).")


ShardingConfig = Annotated[
    HashShardingConfig | RangeShardingConfig | FileShardingConfig, Field(discriminator="kind")
]

# ---------------------------------------------------------------- server optimizers


class RowSGDConfig(ConfigModel):
    """Plain SGD on the pushed rows: w -= lr * g."""

    kind: Literal["sgd"] = "sgd"
    lr: float = Field(0.01, gt=0, description="Learning rate of the server-side update.")


class RowAdagradConfig(ConfigModel):
    """Row-wise Adagrad (PyTorch-BigGraph, DGL-KE): one accumulator per row, the mean of g^2
    over the row, so the state is a scalar per row instead of a copy of the table."""

    kind: Literal["adagrad"] = "adagrad"
    lr: float = Field(0.1, gt=0, description="Learning rate of the server-side update.")
    eps: float = Field(1e-10, gt=0, description="Term added to sqrt(accumulator).")


class LazyAdamConfig(ConfigModel):
    """Adam with lazy (sparse) semantics: a row's moments and step count advance only when
    the row is pushed, so an untouched row's state does not decay."""

    kind: Literal["lazy_adam"] = "lazy_adam"
    lr: float = Field(1e-3, gt=0, description="Learning rate of the server-side update.")
    betas: list[float] = Field(
        [0.9, 0.999], min_length=2, max_length=2, description="[beta1, beta2], each in [0, 1)."
    )
    eps: float = Field(1e-8, gt=0, description="Term added to the denominator.")

    @model_validator(mode="after")
    def _betas_in_range(self) -> LazyAdamConfig:
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must each lie in [0, 1), got {self.betas}")
        return self


RowOptimizerConfig = Annotated[
    RowSGDConfig | RowAdagradConfig | LazyAdamConfig, Field(discriminator="kind")
]

# ---------------------------------------------------------------- the strategy


class ParameterServerStrategyConfig(StrategySection):
    """Embedding tables sharded over servers; workers pull the rows a batch touches and push
    their gradients; the servers apply `optimizer`.

    `mode`: `sync` (every push of clock c is applied before any pull of clock c + 1:
    data-parallel SGD on the same global batch), `async` (pushes applied on arrival,
    no worker waits for another) or `bounded` (stale synchronous parallel: a worker
    may be at most `max_staleness` clocks ahead of the slowest).
    """

    type: Literal["parameter_server"] = "parameter_server"
    workers_field: ClassVar[str | None] = "num_workers"
    #: sync mode splits each global batch over the workers and sums their pushes, so fewer
    #: workers train the same problem; the shard files re-shard over fewer servers
    elastic: ClassVar[bool] = True
    num_workers: int = Field(
        2,
        ge=1,
        description="Worker processes (`--workers` overrides it); each trains on its share "
        "of every global batch.",
        json_schema_extra=RESUME_SAFE,
    )
    num_servers: int = Field(
        1, ge=1, description="Servers, i.e. shards of every table.", json_schema_extra=RESUME_SAFE
    )
    min_servers: int = Field(
        1,
        ge=1,
        description="Elastic (with faults.min_workers): a dedicated server given up (it "
        "failed faults.max_rank_failures times) leaves the job with one server fewer, its "
        "rows re-sharded over the others from the checkpoint, down to this many. "
        "faults.min_workers counts workers only.",
        json_schema_extra=RESUME_SAFE,
    )
    placement: Literal["dedicated", "colocated"] = Field(
        "dedicated",
        description="dedicated: servers are processes of their own (num_workers + "
        "num_servers ranks); colocated: each server runs as a thread inside a worker "
        "(num_servers <= num_workers), dealt over the hosts (see colocate_by_host).",
        json_schema_extra=RESUME_SAFE,
    )
    colocate_by_host: bool = Field(
        True,
        description="colocated: deal the servers over the hosts in turn (server 0 on host "
        "0's first rank, server 1 on host 1's first rank, ...), so every host serves a share "
        "of the tables; false: servers on ranks 0..num_servers-1. On one host both are "
        "ranks 0..num_servers-1.",
    )
    sharding: ShardingConfig = Field(
        default_factory=HashShardingConfig,
        description="Which server owns a row: kind = hash (default) | range | file.",
        json_schema_extra=RESUME_SAFE,
    )
    mode: Literal["sync", "async", "bounded"] = Field(
        "sync", description="Consistency: sync | async | bounded (see max_staleness)."
    )
    max_staleness: int = Field(
        1,
        ge=0,
        description="bounded: the most clocks a worker's pull may be ahead of the slowest "
        "worker's applied pushes (0 behaves as sync).",
    )
    barrier_timeout_s: float = Field(
        60.0,
        gt=0,
        description="The longest a server holds a pull for slower workers before it "
        "fails the job naming them.",
        json_schema_extra=RESUME_SAFE,
    )
    optimizer: RowOptimizerConfig = Field(
        default_factory=RowSGDConfig,
        description="The server-side optimizer for rows: kind = sgd | adagrad | lazy_adam.",
        json_schema_extra=RESUME_FIXED,
    )
    prefetch: bool = Field(
        True,
        description="Pull the next batch's rows while the current batch computes.",
        json_schema_extra=RESUME_SAFE,
    )
    max_message_rows: int = Field(
        65536,
        ge=1,
        description="The most rows one message carries; larger pulls and pushes are split, "
        "and a server rejects a header announcing more.",
        json_schema_extra=RESUME_SAFE,
    )
    shard_dir: str | None = Field(
        None,
        description="A folder (on a local disk) where each server keeps its rows and their "
        "optimizer state as memory-mapped files, so the tables may be larger than the "
        "job's memory: the page cache holds the rows in use. Unset: in memory. The files "
        "are unlinked as soon as they are mapped (nothing is left behind).",
        json_schema_extra=RESUME_SAFE,
    )
    host_rows: Literal["auto", "shared", "messages"] = Field(
        "auto",
        description="How a worker reaches the servers on its own host. shared: it reads "
        "and updates their shards in shared memory (in place, under each shard's lock; "
        "files in /dev/shm, or in shard_dir), with one row-less push per server and clock "
        "so the servers' clocks advance; servers on other hosts by message. messages: "
        "every row by message. auto: shared where it applies (mode async, optimizer "
        "sgd or adagrad, no server restarting alone, room in /dev/shm), else messages.",
        json_schema_extra=RESUME_SAFE,
    )
    worker_memory_budget_mb: float | None = Field(
        None,
        gt=0,
        description="If set, a worker checks that the rows it may hold at once (a batch, "
        "its prefetch and its gradients) fit in this many MiB, and fails "
        "before training otherwise.",
        json_schema_extra=RESUME_SAFE,
    )

    @model_validator(mode="before")
    @classmethod
    def _default_kinds(cls, data: Any) -> Any:
        data = fill_default_tag(data, "sharding", "kind", "hash")
        return fill_default_tag(data, "optimizer", "kind", "sgd")

    @model_validator(mode="after")
    def _consistent(self) -> ParameterServerStrategyConfig:
        if self.min_servers > self.num_servers:
            raise FieldError(
                ("min_servers",),
                f"must be <= num_servers ({self.num_servers}), got {self.min_servers}",
            )
        if self.host_rows == "shared" and self.mode != "async":
            raise FieldError(
                ("host_rows",),
                f'"shared" reads rows as they are, which mode "{self.mode}" does not allow '
                '(a pull waits for other workers\' pushes); set mode = "async" or '
                'host_rows = "auto"',
            )
        if self.host_rows == "shared" and self.optimizer.kind == "lazy_adam":
            raise FieldError(
                ("host_rows",),
                '"shared" updates rows in the workers, and lazy_adam\'s step count is the '
                'server\'s own; use optimizer kind "adagrad" or "sgd", or host_rows = "auto"',
            )
        if self.placement == "colocated" and self.num_servers > self.num_workers:
            raise ValueError(
                f'placement = "colocated" runs each server inside a worker: num_servers '
                f"({self.num_servers}) must be <= num_workers "
                f'({self.num_workers}); lower it or use placement = "dedicated"'
            )
        return self

    @property
    def world_size(self) -> int:
        return self.num_workers + (self.num_servers if self.placement == "dedicated" else 0)

    # ------------------------------------------------------------ the shape
    def server_ranks(self, hosts: Hosts | None) -> list[int]:
        """The rank that runs each server.

        dedicated: ranks W..W+S-1. colocated by host: the first rank of every host in
        host order, then the second rank of every host, ... (on one host: ranks
        0..S-1), so the tables and the pulls they serve are spread over the machines.
        """
        count = self.num_servers
        if self.placement == "dedicated":
            return list(range(self.num_workers, self.num_workers + count))
        if not self.colocate_by_host or hosts is None:
            return list(range(count))
        groups = [[r for r in ranks if r < self.num_workers] for ranks in hosts.groups]
        dealt = [r for tier in itertools.zip_longest(*groups) for r in tier if r is not None]
        return dealt[:count]

    def roles(self, hosts: Hosts | None) -> RankRoles:
        dedicated = self.placement == "dedicated"
        return RankRoles.parameter_server(self.num_workers, self.server_ranks(hosts), dedicated)

    def shape(self, config: ShoalConfig, hosts: Hosts | None = None) -> JobShape:
        """Workers and servers; under `faults.max_restarts` a dedicated server is restarted
        alone (rejoin.py), a co-located one is not: it shares a worker's process, whose
        state died with it."""
        roles = self.roles(hosts)
        alone: set[int] = set()
        notes: dict[int, str] = {}
        if config.faults.max_restarts:
            if self.placement == "dedicated":
                alone = set(roles.servers)
            else:
                notes = {
                    rank: f"rank {rank} runs a worker beside its server (placement colocated): "
                    "its worker's state died with it, so every rank restarts"
                    for rank in roles.servers
                }
        return JobShape(
            roles,
            {"workers": self.num_workers, "servers": self.num_servers},
            elastic=self.elastic,
            alone=frozenset(alone),
            alone_notes=notes,
            labels=self.rank_labels(roles),
            shares_gpus=True,
        )

    def rank_labels(self, roles: RankRoles) -> tuple[str, ...]:
        """'rank 3 (server 1)', 'rank 0 (worker 0, server 0)': a failure names what the rank
        did, so a worker's death is not read as its server's."""
        labels = []
        for rank in range(roles.world_size):
            parts = [f"worker {roles.workers.index(rank)}"] if rank in roles.workers else []
            server = roles.server_of(rank)
            parts += [f"server {server}"] if server is not None else []
            labels.append(f"rank {rank} ({', '.join(parts)})")
        return tuple(labels)

    def without_rank(self, config: ShoalConfig, rank: int) -> Shrink | None:
        """Elastic membership, two floors. A worker given up: one worker fewer, down to
        `faults.min_workers` (which counts workers only), the same global batch (each
        worker trains its share of it, and sync mode sums the shares' pushes); co-located
        servers never outnumber the workers left. A dedicated server given up: one server
        fewer, down to `strategy.min_servers`; every server of the next attempt reads the
        rows it now owns, with their row-optimizer state, from every shard file of the
        checkpoint it resumes from (shards.py: `load_shards` re-shards)."""
        if self.placement == "dedicated" and rank >= self.num_workers:
            servers = self.num_servers - 1
            if servers < self.min_servers:
                return None
            return Shrink(
                self.model_copy(update={"num_servers": servers}),
                {"workers": self.num_workers, "servers": servers},
                f"strategy.min_servers = {self.min_servers}",
            )
        workers = self.num_workers - 1
        floor = config.faults.min_workers
        if workers < floor:
            return None
        servers = (
            self.num_servers if self.placement == "dedicated" else min(self.num_servers, workers)
        )
        return Shrink(
            self._sized(workers, servers),
            {"workers": workers, "servers": servers},
            f"faults.min_workers = {floor}",
        )

    def fitted(self, config: ShoalConfig, world_size: int) -> ParameterServerStrategyConfig:
        """The roles of `world_size` processes (torchrun's world after a host was lost or
        came back). Dedicated: the configured servers stay while enough ranks are left for
        `max(1, faults.min_workers)` workers (else fewer servers, down to
        `strategy.min_servers`), and workers fill the rest; colocated: every process is a
        worker, with at most as many servers. Resuming re-shards the tables over the servers
        (`load_shards`); a worker's share is whole chunks, so any count trains the same."""
        if world_size == self.world_size:
            return self
        if self.placement == "colocated":
            return self._sized(world_size, min(self.num_servers, world_size))
        needed = max(1, config.faults.min_workers)
        servers = max(min(self.num_servers, world_size - needed), self.min_servers)
        workers = world_size - servers
        if workers < 1:
            raise ConfigError(
                f"strategy: {world_size} processes started, and a parameter-server job needs "
                f"strategy.min_servers ({self.min_servers}) dedicated servers and a worker; "
                f"start at least {self.min_servers + 1}"
            )
        return self._sized(workers, servers)

    def _sized(self, workers: int, servers: int) -> ParameterServerStrategyConfig:
        """This section with `workers` workers and `servers` servers (min_servers lowered to
        the servers where it would exceed them)."""
        update = {"num_workers": workers, "num_servers": servers}
        return self.model_copy(update={**update, "min_servers": min(self.min_servers, servers)})

    @property
    def staleness_bound(self) -> int | None:
        """The most clocks a pull may run ahead of the slowest worker (None: unbounded)."""
        return {"sync": 0, "bounded": self.max_staleness, "async": None}[self.mode]

    def check(self, config: ShoalConfig) -> None:
        """The shared loop's length rule, a task whose tables servers can hold, then what
        servers applying pushes as they come allow, and rows shared on a host only where no
        server restarts alone."""
        super().check(config)
        self.require(SERVED_TABLES, config)
        train, faults = config.train, config.faults
        if train.micro_batches != 1:
            raise FieldError(
                ("train",),
                "strategy parameter_server pushes once per batch: set train.micro_batches = 1",
            )
        if train.grad_clip_norm is not None:
            raise FieldError(
                ("train",),
                "strategy parameter_server: servers apply each push as it comes, so there is "
                "no global gradient to clip; unset train.grad_clip_norm",
            )
        if train.warmup_steps or train.lr_decay != "constant":
            raise FieldError(
                ("train",),
                "strategy parameter_server: the server optimizer's learning rate is constant; "
                'set train.warmup_steps = 0 and train.lr_decay = "constant"',
            )
        if train.mixed_precision != "off":
            raise FieldError(
                ("train",),
                'strategy parameter_server trains in float32: set train.mixed_precision = "off"',
            )
        shape = self.shape(config)  # who restarts alone follows the config, not the hosts
        if self.host_rows == "shared" and any(
            shape.restarts_alone(rank)[0] for rank in shape.roles.servers
        ):
            raise FieldError(
                ("strategy", "host_rows"),
                f'"shared" cannot apply: a dedicated server restarts alone under '
                f"faults.max_restarts = {faults.max_restarts}, and its host's workers would "
                'keep the old server\'s rows; set host_rows = "auto" (rows by message), '
                'placement = "colocated" or faults.max_restarts = 0',
            )
        if self.barrier_timeout_s >= faults.timeout_s:
            raise FieldError(
                ("faults",),
                f"strategy.barrier_timeout_s ({self.barrier_timeout_s:g}) must be shorter than "
                f"faults.timeout_s ({faults.timeout_s:g}), so a held pull fails with the name "
                "of the worker it waited for before a bare transport timeout does",
            )
