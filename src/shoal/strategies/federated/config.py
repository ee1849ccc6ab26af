"""`[strategy] type = "federated"`: clients, rounds, local work, aggregation, selection, privacy.

Variants are unions discriminated by `method` (aggregation, client selection) or
`kind` (partition); only implemented variants are accepted. Checks that span
sections (the federated run's length replaces `train.epochs`; a round deadline
must be shorter than the collective timeout) are its `check`, which the root
config calls once every section is valid.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from shoal.config.base import (
    RESUME_SAFE,
    ConfigModel,
    ExistingFile,
    FieldError,
    StrategySection,
    fill_default_tag,
)
from shoal.protocols.capabilities import CLASS_LABELS, CLIENT_FILES, Capability
from shoal.shape.hosts import Hosts
from shoal.shape.roles import RankRoles

if TYPE_CHECKING:
    from shoal.config.root import ShoalConfig

# ---------------------------------------------------------------- aggregation


class FedAvgConfig(ConfigModel):
    """FedAvg (McMahan et al., 2017): the sample-weighted mean of the clients' models."""

    method: Literal["fedavg"] = "fedavg"


class FedProxConfig(ConfigModel):
    """FedProx (Li et al., 2020): FedAvg with (mu/2)||w - w_global||^2 in each local objective."""

    method: Literal["fedprox"] = "fedprox"
    mu: float = Field(0.01, ge=0, description="Weight of the proximal term (0: plain FedAvg).")


class _ServerOptimizerConfig(ConfigModel):
    """Adaptive server optimizers (Reddi et al., ICLR 2021) applied to the averaged update."""

    server_lr: float = Field(0.01, gt=0, description="Server learning rate eta.")
    beta1: float = Field(0.9, ge=0, lt=1, description="Decay of the first moment m.")
    tau: float = Field(
        1e-3, gt=0, description="Adaptivity tau: added to sqrt(v); v starts at tau^2."
    )


class FedAdagradConfig(_ServerOptimizerConfig):
    """FedAdagrad: v accumulates the squared averaged updates."""

    method: Literal["fedadagrad"] = "fedadagrad"


class FedAdamConfig(_ServerOptimizerConfig):
    """FedAdam: v is an exponential moving average of the squared averaged updates."""

    method: Literal["fedadam"] = "fedadam"
    beta2: float = Field(0.99, ge=0, lt=1, description="Decay of the second moment v.")


class FedYogiConfig(_ServerOptimizerConfig):
    """FedYogi: v moves towards the squared update additively, by sign (Zaheer et al., 2018)."""

    method: Literal["fedyogi"] = "fedyogi"
    beta2: float = Field(0.99, ge=0, lt=1, description="Decay of the second moment v.")


FederatedAggregationConfig = Annotated[
    FedAvgConfig | FedProxConfig | FedAdagradConfig | FedAdamConfig | FedYogiConfig,
    Field(discriminator="method"),
]

# ---------------------------------------------------------------- client selection


class AllClientsConfig(ConfigModel):
    """Every client takes part in every round."""

    method: Literal["all"] = "all"


class RandomClientsConfig(ConfigModel):
    """A random subset each round: max(min_clients, floor(fraction * num_clients)) clients.

    Drawn from (train.seed, round) alone, so a run (and a resumed run) picks the
    same clients whatever the number of workers.
    """

    method: Literal["random"] = "random"
    fraction: float = Field(..., gt=0, le=1, description="Share of the clients picked per round.")
    min_clients: int = Field(1, ge=1, description="Pick at least this many clients.")


class ByCapabilityConfig(ConfigModel):
    """Only clients that carry every one of `required_tags` take part."""

    method: Literal["by_capability"] = "by_capability"
    required_tags: list[str] = Field(
        ..., min_length=1, description="Tags a client must have (strategy.client_tags or files)."
    )


ClientSelectionConfig = Annotated[
    AllClientsConfig | RandomClientsConfig | ByCapabilityConfig,
    Field(discriminator="method"),
]

# ---------------------------------------------------------------- partition


class IIDPartitionConfig(ConfigModel):
    """Shuffle the training samples and cut them into near-equal shards, one per client."""

    kind: Literal["iid"] = "iid"
    seed: int = Field(0, ge=0, description="Seed of the shuffle.")


class DirichletPartitionConfig(ConfigModel):
    """Label skew: each class is split over the clients in Dirichlet(alpha) proportions.

    After Hsu et al. (2019): small alpha gives each client a few dominant classes,
    large alpha tends to IID. Draws again (up to 100 times) until every client
    holds at least `min_samples`.
    """

    kind: Literal["dirichlet"] = "dirichlet"
    alpha: float = Field(0.5, gt=0, description="Concentration: smaller is more skewed.")
    min_samples: int = Field(1, ge=0, description="Least number of samples per client.")
    seed: int = Field(0, ge=0, description="Seed of the draw.")


class ClientFileConfig(ConfigModel):
    """One client's own data file, read only by the worker that hosts the client."""

    path: ExistingFile = Field(..., description="The client's CSV or NPZ file.")
    tags: list[str] = Field(default_factory=list, description="The client's capability tags.")


class FilesPartitionConfig(ConfigModel):
    """Each client's samples come from its own file (same format as task.data)."""

    kind: Literal["files"] = "files"
    clients: list[ClientFileConfig] = Field(
        ..., min_length=1, description="One entry per client, in client order."
    )


PartitionConfig = Annotated[
    IIDPartitionConfig | DirichletPartitionConfig | FilesPartitionConfig,
    Field(discriminator="kind"),
]

# ---------------------------------------------------------------- privacy, faults


class DifferentialPrivacyConfig(ConfigModel):
    """Client-level DP (McMahan et al., ICLR 2018): clip each update, add Gaussian noise.

    Each client's model update is clipped to L2 norm `clip_norm`; the clipped
    updates are averaged with equal weights, and Gaussian noise of standard
    deviation noise_multiplier * clip_norm is added to their sum.
    """

    clip_norm: float = Field(..., gt=0, description="L2 bound on each client's update.")
    noise_multiplier: float = Field(
        ..., ge=0, description="Noise standard deviation, in units of clip_norm."
    )


class PrivacyConfig(ConfigModel):
    """What the aggregate may reveal about one client."""

    secure_aggregation: bool = Field(
        False,
        description="Pairwise additive masking (Bonawitz et al., 2017): peers learn only the "
        "sum of the clients' updates.",
    )
    differential: DifferentialPrivacyConfig | None = Field(
        None, description="Client-level differential privacy: clip and noise each update."
    )


class ClientFault(ConfigModel):
    """Deliberately break one client in one round, to test dropouts."""

    client: int = Field(..., ge=0, description="Client that fails.")
    round: int = Field(..., ge=0, description="Round (0-based) in which it fails.")
    kind: Literal["raise", "stall"] = Field(
        "raise", description="raise an exception, or stall past strategy.round_timeout_s."
    )


# ---------------------------------------------------------------- the strategy


class FederatedStrategyConfig(StrategySection):
    """Federated learning: clients train locally on private shards; only updates travel.

    `[train]` describes one client's local work: batch_size, optimizer (the local
    optimizer, fresh every round), seed, grad_clip_norm. The run's length is
    `rounds`, not train.epochs.
    """

    type: Literal["federated"] = "federated"
    workers_field: ClassVar[str | None] = "workers"
    in_process: ClassVar[bool] = True  # with one worker: no process group, nothing crosses
    #: a worker given up (`[faults] min_workers`) takes no client with it: client c lives on
    #: worker c mod workers, so the next attempt hosts the lost worker's clients on the
    #: others, and every draw of a round is seeded by (seed, round, client), not by worker.
    #: A round then equals the same round of a run that had that assignment from the
    #: start (the sum of updates is grouped per worker, then over workers in rank order:
    #: fixed for an assignment, but not the grouping of a run with more workers)
    elastic: ClassVar[bool] = True

    num_clients: int = Field(10, ge=1, description="Clients (may exceed the workers).")
    workers: int = Field(
        2,
        ge=1,
        description="Worker processes that host the clients; each runs its clients in turn "
        "(`--workers` overrides it).",
        json_schema_extra=RESUME_SAFE,
    )
    rounds: int = Field(
        10,
        ge=1,
        description="Federated rounds (one server update each).",
        json_schema_extra=RESUME_SAFE,
    )
    balance: Literal["static", "balanced", "dynamic"] = Field(
        "static",
        description="Which worker runs which client: static (client c on worker c mod "
        "workers), balanced (placed once by expected work, samples x local epochs, longest "
        "first), or dynamic (each round, a worker that is free takes the next selected client, "
        "longest first, from a queue in the job's store). The global model is the same bits "
        "under all three: the updates are summed exactly.",
        json_schema_extra=RESUME_SAFE,
    )
    local_epochs: int | None = Field(
        None, ge=1, description="Passes over its own data a client makes per round (default 1)."
    )
    local_steps: int | None = Field(
        None, ge=1, description="Or: local optimizer steps a client takes per round."
    )
    min_clients: int = Field(
        1, ge=1, description="A round needs at least this many client reports, or the run fails."
    )
    round_timeout_s: float | None = Field(
        None,
        gt=0,
        description="A client still training this long after its round started is dropped "
        "(checked between local steps).",
        json_schema_extra=RESUME_SAFE,
    )
    eval_every_rounds: int = Field(
        1,
        ge=0,
        description="Evaluate the global model every N rounds (0: only at the end).",
        json_schema_extra=RESUME_SAFE,
    )
    aggregation: FederatedAggregationConfig = Field(
        default_factory=FedAvgConfig,
        description="method = fedavg | fedprox | fedadagrad | fedadam | fedyogi.",
    )
    client_selection: ClientSelectionConfig = Field(
        default_factory=AllClientsConfig,
        description="Who takes part in a round: method = all | random | by_capability.",
    )
    partition: PartitionConfig = Field(
        default_factory=IIDPartitionConfig,
        description="Which samples each client holds: kind = iid | dirichlet | files.",
    )
    client_tags: dict[str, list[Annotated[int, Field(ge=0)]]] = Field(
        default_factory=dict,
        description="Capability tags: tag name -> the ids of the clients that have it.",
    )
    privacy: PrivacyConfig = Field(
        default_factory=PrivacyConfig, description="Secure aggregation and differential privacy."
    )
    audit_wire: bool = Field(
        False,
        description="Keep every tensor this worker sends or receives in logs/wire-rank-<r>.pt, "
        "to audit what leaves a client (small models only).",
        json_schema_extra=RESUME_SAFE,
    )
    inject: list[ClientFault] = Field(
        default_factory=list,
        description="Client faults for testing dropouts; leave unset.",
        json_schema_extra=RESUME_SAFE,
    )

    @model_validator(mode="before")
    @classmethod
    def _default_tags(cls, data: Any) -> Any:
        data = fill_default_tag(data, "aggregation", "method", "fedavg")
        data = fill_default_tag(data, "client_selection", "method", "all")
        return fill_default_tag(data, "partition", "kind", "iid")

    @model_validator(mode="after")
    def _check(self) -> FederatedStrategyConfig:
        n = self.num_clients
        if self.local_epochs is not None and self.local_steps is not None:
            raise ValueError("set local_epochs or local_steps, not both")
        if self.local_epochs is None and self.local_steps is None:
            self.local_epochs = 1
        if self.workers > n:
            raise ValueError(f"workers ({self.workers}) cannot exceed num_clients ({n})")
        if self.min_clients > n:
            raise ValueError(f"min_clients ({self.min_clients}) cannot exceed num_clients ({n})")
        for tag, ids in self.client_tags.items():
            bad = [i for i in ids if i >= n]
            if bad:
                raise ValueError(f"client_tags.{tag}: client ids {bad} are not < num_clients ({n})")
        if isinstance(self.partition, FilesPartitionConfig) and len(self.partition.clients) != n:
            raise ValueError(
                f"partition.clients lists {len(self.partition.clients)} files for "
                f"num_clients = {n}; give one file per client"
            )
        for fault in self.inject:
            if fault.client >= n:
                raise ValueError(f"inject: client {fault.client} is not < num_clients ({n})")
            if fault.kind == "stall" and self.round_timeout_s is None:
                raise ValueError("inject: a stall fault needs strategy.round_timeout_s")
        if self.balance != "static" and isinstance(self.partition, FilesPartitionConfig):
            raise ValueError(
                f'balance = "{self.balance}" needs every client\'s sample count before the '
                "workers read their files, and a files partition has them only in the files; "
                'use balance = "static" with partition kind = "files"'
            )
        if self.balance == "dynamic" and self.privacy.secure_aggregation:
            raise ValueError(
                'balance = "dynamic" moves clients between workers, but under secure '
                "aggregation a client's key pair lives on one worker; use balance = "
                '"balanced" (a fixed placement by expected work)'
            )
        least = self.least_selected()
        if least < self.min_clients:
            raise ValueError(
                f"client_selection ({self.client_selection.method}) picks only {least} clients "
                f"per round but min_clients = {self.min_clients}: every round would fail"
            )
        return self

    def tags_of(self) -> list[set[str]]:
        """Each client's tags, from `client_tags` and the per-client files."""
        tags: list[set[str]] = [set() for _ in range(self.num_clients)]
        for tag, ids in self.client_tags.items():
            for client in ids:
                tags[client].add(tag)
        if isinstance(self.partition, FilesPartitionConfig):
            for client, spec in enumerate(self.partition.clients):
                tags[client].update(spec.tags)
        return tags

    def least_selected(self) -> int:
        """The fewest clients a round selects under this config."""
        selection, n = self.client_selection, self.num_clients
        if isinstance(selection, RandomClientsConfig):
            return min(n, max(selection.min_clients, math.floor(selection.fraction * n + 1e-9)))
        if isinstance(selection, ByCapabilityConfig):
            required = set(selection.required_tags)
            return sum(1 for tags in self.tags_of() if required <= tags)
        return n

    def roles(self, hosts: Hosts | None) -> RankRoles:
        """Client c lives on worker c mod workers."""
        return RankRoles.hosting(self.workers, "client", self.num_clients)

    def check(self, config: ShoalConfig) -> None:
        """The run's length is in rounds, at a constant rate; a round deadline fits the timeout.

        No `StrategySection` length rule: rounds, not epochs, end a federated run."""
        train, faults = config.train, config.faults
        if train.epochs is not None or train.max_steps is not None:
            raise FieldError(
                ("train",),
                "under strategy federated the run's length is strategy.rounds (with "
                "strategy.local_epochs or local_steps per round); remove epochs and max_steps",
            )
        if train.warmup_steps or train.lr_decay != "constant":
            raise FieldError(
                ("train",),
                "strategy federated trains each client with a fresh local optimizer at a "
                'constant learning rate; remove warmup_steps and lr_decay (or set "constant")',
            )

        if self.round_timeout_s is not None and self.round_timeout_s >= faults.timeout_s:
            raise FieldError(
                ("faults",),
                f"timeout_s ({faults.timeout_s:g}) must exceed strategy.round_timeout_s "
                f"({self.round_timeout_s:g}): workers wait for each other's round in a collective",
            )
        needs: Capability[Any] | None = None
        if isinstance(self.partition, DirichletPartitionConfig):
            needs = CLASS_LABELS
        elif isinstance(self.partition, FilesPartitionConfig):
            needs = CLIENT_FILES
        refusal = needs.require(config.task, "federated") if needs is not None else None
        if refusal is not None:
            raise FieldError(("strategy", "partition", "kind"), refusal)
