"""`[task]` with `type = "kge"`: link prediction with knowledge-graph embeddings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, ValidationInfo, model_validator

from shoal.config.base import (
    RESUME_FIXED,
    RESUME_SAFE,
    ConfigModel,
    ExistingFile,
    FieldError,
    TaskSection,
    fill_default_tag,
    resolve_existing_file,
)
from shoal.plugins.kinds import KGE_LOSSES, KGE_MODELS
from shoal.protocols.capabilities import SERVED_TABLES, Capability
from shoal.tasks.kge.loss_config import (
    BCELossConfig,
    LogisticLossConfig,
    LossOptions,
    MarginRankingLossConfig,
    RegularizationConfig,
    SoftmaxLossConfig,
)
from shoal.tasks.kge.model_config import (
    ComplExConfig,
    DistMultConfig,
    InitConfig,
    ModelOptions,
    RotatEConfig,
    TransEConfig,
)

__all__ = [
    "BCELossConfig",
    "ComplExConfig",
    "DistMultConfig",
    "InitConfig",
    "KGELossConfig",
    "KGEModelConfig",
    "KGETaskConfig",
    "LogisticLossConfig",
    "LossOptions",
    "MarginRankingLossConfig",
    "ModelOptions",
    "NegativeSamplingConfig",
    "PreparedDataConfig",
    "RegularizationConfig",
    "RotatEConfig",
    "SoftmaxLossConfig",
    "TransEConfig",
]

# `task.model` and `task.loss`: every KG model and loss registered (shoal's own and
# installed plugins), discriminated by `type` and `kind`
if TYPE_CHECKING:
    KGEModelConfig = Any
    KGELossConfig = Any
else:
    KGEModelConfig = KGE_MODELS.config_union()
    KGELossConfig = KGE_LOSSES.config_union()

BUILTIN_DATASETS = ("nations", "kinships", "umls")


class BuiltinDataConfig(ConfigModel):
    """A small standard dataset read from the files inside the `pykeen` wheel.

    Needs the optional extra: `pip install 'shoal[datasets]'` (pykeen is only read
    from, never imported).
    """

    source: Literal["builtin"] = "builtin"
    name: Literal["nations", "kinships", "umls"] = Field(
        ..., description="Dataset: nations | kinships | umls.", json_schema_extra=RESUME_FIXED
    )
    unseen: Literal["skip", "error"] = Field(
        "skip",
        description="Valid/test triples with an entity or relation absent from training: "
        "skip = count, report and leave them out of evaluation; error = stop at the first.",
    )


class FilesDataConfig(ConfigModel):
    """Triples from TSV files: `head<TAB>relation<TAB>tail` a line, optionally gzip-compressed.

    CRLF line endings are tolerated and blank lines skipped. Entity and relation
    ids are given in sorted order of the labels seen in training, so the same
    training file always gives the same ids.
    """

    source: Literal["files"] = "files"
    train: ExistingFile = Field(
        ...,
        description="Training triples (relative to the config).",
        json_schema_extra=RESUME_FIXED,
    )
    valid: ExistingFile | None = Field(
        None, description="Validation triples: periodic evaluation and the best checkpoint."
    )
    test: ExistingFile | None = Field(
        None, description="Test triples, evaluated once at the end with the best model."
    )
    unseen: Literal["skip", "error"] = Field(
        "skip",
        description="Valid/test triples with an entity or relation absent from training: "
        "skip = count, report and leave them out of evaluation; error = stop at the first.",
    )


def _prepared_manifest(value: str, info: ValidationInfo) -> str:
    """A prepared folder (or its manifest.json) -> the manifest's absolute path, after the
    checks that cost a stat per file: a manifest of this format, every file at its size."""
    from pathlib import Path

    from shoal.errors import DataError
    from shoal.tasks.kge.prepared.manifest import MANIFEST, check_sizes, read_manifest

    path = Path(resolve_existing_file(value, info, kind="folder"))
    folder = path.parent if path.name == MANIFEST and path.is_file() else path
    try:
        check_sizes(folder, read_manifest(folder))
    except DataError as exc:
        raise ValueError(str(exc)) from None
    return str(folder / MANIFEST)


#: a prepared graph's folder, held as its manifest's path: the manifest's checksums cover
#: every file, so a checkpoint's record of it (checkpoint/fingerprint.py) covers the graph
PreparedManifest = Annotated[
    str, AfterValidator(_prepared_manifest), AfterValidator(resolve_existing_file)
]


class PreparedDataConfig(ConfigModel):
    """A graph prepared by `shoal kge prepare` (or `shoal kge synthesize`): memory-mapped
    triples, names, degrees and filter index, read by every process without parsing.

    The folder's files are checked against its manifest: sizes at every use (and at
    `shoal config validate`), every byte at the first use of these files.
    """

    source: Literal["graph"] = "graph"  # not "prepared": the field's name, in error paths
    prepared: PreparedManifest = Field(
        ..., description="Folder written by `shoal kge prepare` (relative to the config)."
    )
    unseen: Literal["skip", "error"] = Field(
        "skip",
        description="Valid/test triples with an entity or relation absent from training "
        "(counted when the graph was prepared): skip = leave them out of evaluation; "
        "error = stop at the first.",
    )


KGEDataConfig = Annotated[
    BuiltinDataConfig | FilesDataConfig | PreparedDataConfig, Field(discriminator="source")
]


class NegativeSamplingConfig(ConfigModel):
    """How corrupted triples are drawn for each positive.

    Either one side per positive: (h, r, t) is corrupted into (h', r, t) or (h, r, t')
    with `num_negatives` entities, the side chosen by `side`; or both sides, each with
    its own count (`num_negatives_s` heads, `num_negatives_o` tails, LibKGE's recipe),
    the loss then summing one term per side. With `chunk_size` > 1, consecutive
    positives form chunks that share one set of negatives per side (DGL-KE's "joint"
    sampling), so scoring a chunk is one matrix product instead of chunk_size.
    """

    num_negatives: int | None = Field(
        None,
        ge=1,
        description="Negative triples per positive, on the one side `side` picks (default 64 "
        "unless num_negatives_s / num_negatives_o are set).",
    )
    num_negatives_s: int | None = Field(
        None,
        ge=0,
        description="Corrupt both sides: this many heads per positive (with num_negatives_o; "
        "0 = never the head). Replaces num_negatives and side.",
    )
    num_negatives_o: int | None = Field(
        None,
        ge=0,
        description="Corrupt both sides: this many tails per positive (with num_negatives_s; "
        "0 = never the tail). Replaces num_negatives and side.",
    )
    chunk_size: int = Field(
        1,
        ge=1,
        description="Positives that share one negative set (1: every positive draws its own).",
    )
    side: Literal["uniform", "bernoulli"] | None = Field(
        None,
        description="Which side is corrupted: uniform = head or tail with probability 1/2; "
        "bernoulli = by the relation's tails-per-head / heads-per-tail (Wang et al., 2014). "
        "Default bernoulli unless num_negatives_s / num_negatives_o are set.",
    )
    distribution: Literal["uniform", "degree"] = Field(
        "uniform",
        description="Replacement entities: uniform over entities, or proportional to each "
        "entity's degree in the training graph.",
    )

    @property
    def per_side(self) -> bool:
        """Both sides corrupted, each with its own count."""
        return self.num_negatives_s is not None or self.num_negatives_o is not None

    @property
    def side_counts(self) -> list[tuple[str, int]]:
        """(side, negatives) of each loss term per positive: "head", "tail", or "either"
        (one side per positive, chosen by `side`)."""
        if not self.per_side:
            return [("either", self.num_negatives or 64)]
        counts = [("head", self.num_negatives_s or 0), ("tail", self.num_negatives_o or 0)]
        return [(name, k) for name, k in counts if k > 0]

    @model_validator(mode="after")
    def _one_scheme(self) -> NegativeSamplingConfig:
        # The one-side scheme's settings stay None under the per-side scheme, so that the
        # resolved config a run saves (defaults filled in, None left out) loads again.
        if not self.per_side:
            self.num_negatives = 64 if self.num_negatives is None else self.num_negatives
            self.side = self.side or "bernoulli"
        else:
            mixed = [name for name in ("num_negatives", "side") if getattr(self, name) is not None]
            if mixed:
                raise ValueError(
                    f"{' and '.join(mixed)} pick one side per positive, num_negatives_s / "
                    "num_negatives_o corrupt both: set one scheme or the other"
                )
            if not self.side_counts:
                raise ValueError("num_negatives_s and num_negatives_o are both 0: no negatives")
        return self


#: why a parameter server cannot train a training type that scores every entity
EVERY_ENTITY_UNSERVED = (
    "it scores every entity in every step, so a worker would pull the whole entity table "
    "each step; train it with strategy local or data_parallel, or use negative_sampling"
)


class NegativeSamplingTraining(ConfigModel):
    """Each positive against sampled negatives (`task.negatives`)."""

    type: Literal["negative_sampling"] = "negative_sampling"
    #: whether a batch reads only rows it can name in advance, which a parameter-server
    #: worker must pull before computing (None: it can; else why not)
    unserved: ClassVar[str | None] = None


class OneVsAllTraining(ConfigModel):
    """Each training triple (h, r, t) as two queries, (h, r, ?) and (?, r, t), each scored
    against every entity, the true entity the positive (Lacroix et al., 2018; LibKGE 1vsAll)."""

    type: Literal["1vsAll"] = "1vsAll"
    unserved: ClassVar[str | None] = EVERY_ENTITY_UNSERVED


class KvsAllTraining(ConfigModel):
    """Each distinct query (h, r, ?) and (?, r, t) of the training data, scored against every
    entity, with all its known answers as positives (Dettmers et al., 2018; LibKGE KvsAll).
    A training sample is a query, not a triple."""

    type: Literal["KvsAll"] = "KvsAll"
    unserved: ClassVar[str | None] = EVERY_ENTITY_UNSERVED
    label_smoothing: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Labels (1 - s) * y + 1 / entities, as ConvE and LibKGE smooth them.",
    )


KGETrainingConfig = Annotated[
    NegativeSamplingTraining | OneVsAllTraining | KvsAllTraining, Field(discriminator="type")
]


class EvaluationConfig(ConfigModel):
    """Filtered link prediction: rank the true entity of each held-out triple, both sides.

    `ranking = "full"` ranks it among every entity: the figures papers report for
    FB15k-237-sized graphs, at a cost of (triples x entities) scores per evaluation.
    `ranking = "sampled"` ranks it among `sampled_negatives` entities drawn per query
    (OGB's wikikg2 protocol: 500 per side), filtered the same way: for graphs of
    millions of entities, where full ranking costs hours. Its MRR is higher than the
    full ranking's and comparable only with another run's at the same count.
    """

    # ranking and sampled_negatives are unmarked, as `filtered`: they change what the MRR
    # that picks the best checkpoint measures, so a resume changing them needs --allow-changes
    ranking: Literal["full", "sampled"] = Field(
        "full",
        description="full = against every entity (graphs up to ~100k entities, the figures "
        "papers report); sampled = against sampled_negatives entities per query (millions "
        "of entities; OGB wikikg2's protocol).",
    )
    sampled_negatives: int | None = Field(
        None,
        ge=1,
        description="With ranking = sampled: entities drawn per query and side, without "
        "repetition, never the answer (default 500; at least the entities: full ranking).",
    )
    batch_size: int = Field(
        256,
        ge=1,
        description="Triples ranked at once (bounds memory).",
        json_schema_extra=RESUME_SAFE,
    )
    filtered: bool = Field(
        True, description="Leave every other known true triple out of the ranking (Bordes 2013)."
    )
    hits_at: list[Annotated[int, Field(ge=1)]] = Field(
        [1, 3, 10],
        min_length=1,
        description="Report hits@k for these k.",
        json_schema_extra=RESUME_SAFE,
    )
    max_triples: int | None = Field(
        None,
        ge=1,
        description="Rank only this many triples of a split (a fixed seeded sample), for quick "
        "checks; unset for the figures you report.",
    )
    block_elements: int = Field(
        1 << 24,
        ge=1 << 10,
        description="Largest intermediate (triples x entities x width) of distance-based "
        "scoring, in elements: bounds evaluation memory.",
        json_schema_extra=RESUME_SAFE,
    )

    @model_validator(mode="after")
    def _sampled_count(self) -> EvaluationConfig:
        # the count stays None under full ranking, so the resolved config a run saves loads again
        if self.ranking == "sampled" and self.sampled_negatives is None:
            self.sampled_negatives = 500
        elif self.ranking == "full" and self.sampled_negatives is not None:
            raise ValueError(
                'sampled_negatives applies to ranking = "sampled"; set that or remove it'
            )
        return self


def _every_entity_losses() -> str:
    """The registered losses a query scored against every entity can use: "softmax or bce"."""
    names = [
        name
        for name in KGE_LOSSES.names()
        if getattr(KGE_LOSSES.get(name).config_class(), "every_entity", False)
    ]
    return " or ".join(names)


class KGETaskConfig(TaskSection):
    """Link prediction: learn entity and relation embeddings from (head, relation, tail) triples."""

    type: Literal["kge"] = "kge"
    data: KGEDataConfig = Field(
        ...,
        description="The triples: source = builtin (name = ...) | files (train = ...) | "
        "graph (prepared = folder).",
        json_schema_extra=RESUME_FIXED,
    )
    model: KGEModelConfig = Field(
        ...,
        description=f"Scoring model: type = {' | '.join(KGE_MODELS.names())}.",
        json_schema_extra=RESUME_FIXED,
    )
    dim: int = Field(
        200,
        ge=2,
        description="Real numbers per entity row (complex models: dim/2 complex).",
        json_schema_extra=RESUME_FIXED,
    )
    training: KGETrainingConfig = Field(
        default_factory=NegativeSamplingTraining,
        description="Training type: negative_sampling | 1vsAll | KvsAll (label_smoothing).",
    )
    negatives: NegativeSamplingConfig = Field(
        default_factory=NegativeSamplingConfig,
        description="Negative sampling (training type negative_sampling).",
    )
    loss: KGELossConfig = Field(
        default_factory=MarginRankingLossConfig,
        description=f"Loss: kind = {' | '.join(KGE_LOSSES.names())}.",
    )
    regularization: RegularizationConfig | None = Field(
        None, description="Penalty on embedding entries: kind = l2 | n3 | lp, weighted or not."
    )
    evaluation: EvaluationConfig = Field(
        default_factory=EvaluationConfig, description="Filtered ranking evaluation."
    )
    sparse_gradients: bool = Field(
        False,
        description="Row gradients as sparse tensors: the optimizer (sparse_adam, adagrad or sgd "
        "without momentum) updates only the rows a batch used. Strategy local only.",
    )
    compiled_scoring: bool | Literal["auto"] = Field(
        "auto",
        description="Compile the negative-sampling step's scoring and loss with torch.compile "
        "(CPU; TransE, DistMult, ComplEx): a compilation of seconds per batch shape at the "
        "first steps, then faster steps. auto: when the run plans at least "
        "COMPILE_AFTER_STEPS (5000) steps, so the compilation pays for itself.",
        json_schema_extra=RESUME_SAFE,
    )

    #: its two tables read a batch's rows at a time: parameter servers can hold them
    primary_metric: ClassVar[tuple[str, str]] = ("mrr", "max")
    offers: ClassVar[frozenset[Capability[Any]]] = frozenset({SERVED_TABLES})

    def lacks(self, capability: Capability[Any]) -> str | None:
        """Served tables need a batch that names its rows in advance and a penalty on those
        rows only."""
        if capability is SERVED_TABLES:
            if self.training.unserved is not None:
                return f"task.training.type = {self.training.type!r}: {self.training.unserved}"
            regularization = self.regularization
            if regularization is not None and not regularization.weighted:
                return (
                    "task.regularization.weighted = false penalises every row of both tables "
                    "each step, which a worker never holds; set weighted = true"
                )
        return super().lacks(capability)

    def table_shapes(self) -> dict[str, tuple[int, int]]:
        """The entity and relation tables of the model (built on the meta device: any model,
        reciprocal relations included) for the graph's counts, when its manifest says them."""
        from shoal.tasks.kge.triples import graph_size

        size = graph_size(self.data)
        if size is None:
            return {}
        import torch

        from shoal.tasks.kge.models import build_kge_model

        with torch.device("meta"):
            model = build_kge_model(self.model, size[0], size[1], self.dim, gamma=1.0)
        tables = {"entity": model.entity.weight, "relation": model.relation.weight}
        return {name: (int(t.shape[0]), int(t.shape[1])) for name, t in tables.items()}

    def check(self, config: Any) -> None:
        """Rules between the task and the rest of the job: a chunk of positives fits in a
        batch; sparse row gradients need a row-wise optimizer and one process."""
        batch = config.train.batch_size
        if self.training.type == "negative_sampling" and self.negatives.chunk_size > batch:
            raise FieldError(
                ("task", "negatives", "chunk_size"),
                f"{self.negatives.chunk_size} exceeds train.batch_size ({batch}); make it at "
                "most the batch size",
            )
        if self.sparse_gradients:
            problem = _sparse_problem(config)
            if problem is not None:
                raise FieldError(
                    ("task", "sparse_gradients"), f"true: {problem} (or set it to false)"
                )

    @model_validator(mode="before")
    @classmethod
    def _default_tags(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("data"), dict):
            source = (
                "builtin"
                if "name" in data["data"]
                else "graph"
                if "prepared" in data["data"]
                else "files"
            )
            data = fill_default_tag(data, "data", "source", source)
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            data = {**data, "model": {"type": data["model"]}}
        if isinstance(data, dict) and isinstance(data.get("training"), str):
            data = {**data, "training": {"type": data["training"]}}
        data = fill_default_tag(data, "training", "type", "negative_sampling")
        data = fill_default_tag(data, "loss", "kind", "margin_ranking")
        return data

    @model_validator(mode="after")
    def _check(self) -> KGETaskConfig:
        if self.model.complex_rows and self.dim % 2:
            raise ValueError(
                f"dim must be even for {self.model.type} (dim/2 complex numbers), got {self.dim}"
            )
        training = self.training.type
        if training != "negative_sampling":
            if not self.loss.every_entity:
                raise ValueError(
                    f"loss {self.loss.kind!r} pairs a positive with sampled negatives; training "
                    f"{training} scores every entity: use loss kind {_every_entity_losses()}"
                )
            # (the resolved config a run saves holds the default table: it loads again)
            if self.negatives != NegativeSamplingConfig():
                raise ValueError(
                    f"negatives: training {training} scores every entity and samples none; "
                    "remove task.negatives"
                )
        if self.sparse_gradients:
            if training != "negative_sampling":
                raise ValueError(
                    f"sparse_gradients: training {training} scores every entity, so every row "
                    "has a gradient each step; set sparse_gradients = false"
                )
            if self.regularization is not None and not self.regularization.weighted:
                raise ValueError(
                    "sparse_gradients: regularization weighted = false penalises every row "
                    "each step; set weighted = true or sparse_gradients = false"
                )
        return self


SPARSE_OPTIMIZERS = ("sparse_adam", "adagrad", "sgd")


def _sparse_problem(config: Any) -> str | None:
    """What keeps sparse row gradients from training this job (None: nothing): a row-wise
    optimizer and one process (dense buckets cannot carry them; the parameter-server
    strategy is where sparse rows travel)."""
    train = config.train
    kind = train.optimizer.kind
    if kind not in SPARSE_OPTIMIZERS:
        choices = ", ".join(SPARSE_OPTIMIZERS)
        return (
            f"train.optimizer.kind = {kind!r} cannot apply sparse gradients; use one of {choices}"
        )
    if kind == "sgd" and getattr(train.optimizer, "momentum", 0.0) > 0:
        return "train.optimizer: sgd with momentum cannot apply sparse gradients; set momentum = 0"
    if not getattr(config.strategy, "carries_sparse_gradients", False):
        strategy = config.strategy.type
        return f"strategy {strategy!r} reduces dense gradients; use strategy local"
    if train.grad_clip_norm is not None:
        return "train.grad_clip_norm cannot clip sparse gradients; unset it"
    return None
