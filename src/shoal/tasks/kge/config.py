"""`[task]` with `type = "kge"`: link prediction with knowledge-graph embeddings."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from shoal.config.base import ConfigModel, ExistingFile, fill_default_tag

BUILTIN_DATASETS = ("nations", "kinships", "umls")


class BuiltinDataConfig(ConfigModel):
    """A small standard dataset read from the files inside the `pykeen` wheel.

    Needs the optional extra: `pip install 'shoal[datasets]'` (pykeen is only read
    from, never imported).
    """

    source: Literal["builtin"] = "builtin"
    name: Literal["nations", "kinships", "umls"] = Field(
        ..., description="Dataset: nations | kinships | umls."
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
    train: ExistingFile = Field(..., description="Training triples (relative to the config).")
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


KGEDataConfig = Annotated[BuiltinDataConfig | FilesDataConfig, Field(discriminator="source")]


class TransEConfig(ConfigModel):
    """TransE (Bordes et al., 2013): score = -||h + r - t||_p."""

    type: Literal["transe"] = "transe"
    p: Literal[1, 2] = Field(1, description="Norm of the translation distance: 1 or 2.")
    normalize_entities: bool = Field(
        True,
        description="Score with unit-length entity rows, the paper's constraint ||e||_2 = 1 "
        "(applied to the rows as they are used, so it is differentiable).",
    )
    init_scale: float = Field(1.0, gt=0, description="Multiplies the paper's initialisation.")


class DistMultConfig(ConfigModel):
    """DistMult (Yang et al., 2015): score = <h, r, t> = sum_i h_i r_i t_i."""

    type: Literal["distmult"] = "distmult"
    init_scale: float = Field(1.0, gt=0, description="Multiplies the Xavier initialisation.")


class ComplExConfig(ConfigModel):
    """ComplEx (Trouillon et al., 2016): score = Re(<h, r, conj(t)>), complex rows.

    A row of width `dim` holds dim/2 complex numbers: real parts, then imaginary parts.
    """

    type: Literal["complex"] = "complex"
    init_scale: float = Field(
        1.0, gt=0, description="Standard deviation of the normal initialisation (paper: 1)."
    )


class RotatEConfig(ConfigModel):
    """RotatE (Sun et al., 2019): score = -sum_i |h_i r_i - t_i|, |r_i| = 1.

    Entities hold dim/2 complex numbers; relations hold dim/2 phases, so every
    relation is a rotation in the complex plane (unit modulus by construction).
    """

    type: Literal["rotate"] = "rotate"
    init_scale: float = Field(
        1.0, gt=0, description="Multiplies the paper's entity initialisation U(+-(gamma+2)/k)."
    )


KGEModelConfig = Annotated[
    TransEConfig | DistMultConfig | ComplExConfig | RotatEConfig, Field(discriminator="type")
]


class NegativeSamplingConfig(ConfigModel):
    """How corrupted triples are drawn for each positive.

    A positive (h, r, t) is corrupted on one side, into (h', r, t) or (h, r, t'). With
    `chunk_size` > 1, consecutive positives form chunks that share one set of
    `num_negatives` entities (DGL-KE's "joint" sampling), so scoring a chunk is one
    matrix product instead of chunk_size separate ones.
    """

    num_negatives: int = Field(64, ge=1, description="Negative triples per positive.")
    chunk_size: int = Field(
        1,
        ge=1,
        description="Positives that share one negative set (1: every positive draws its own).",
    )
    side: Literal["uniform", "bernoulli"] = Field(
        "bernoulli",
        description="Which side is corrupted: uniform = head or tail with probability 1/2; "
        "bernoulli = by the relation's tails-per-head / heads-per-tail (Wang et al., 2014).",
    )
    distribution: Literal["uniform", "degree"] = Field(
        "uniform",
        description="Replacement entities: uniform over entities, or proportional to each "
        "entity's degree in the training graph.",
    )


class MarginRankingLossConfig(ConfigModel):
    """max(0, margin - score(pos) + score(neg)), averaged (or weighted) over the negatives."""

    kind: Literal["margin_ranking"] = "margin_ranking"
    margin: float = Field(1.0, gt=0, description="The margin between positive and negative scores.")
    adversarial_temperature: float | None = Field(
        None,
        gt=0,
        description="Self-adversarial weights softmax(alpha * score(neg)) instead of a plain mean "
        "(Sun et al., 2019); unset: uniform weights.",
    )


class LogisticLossConfig(ConfigModel):
    """softplus(-(gamma + score(pos))) + weighted mean of softplus(gamma + score(neg)).

    With gamma = the margin of RotatE and self-adversarial weights this is RotatE's
    loss; with gamma = 0 it is the plain logistic loss of DistMult and ComplEx.
    """

    kind: Literal["logistic"] = "logistic"
    margin: float = Field(
        0.0, description="gamma, added to every score (RotatE's and TransE-style distance models')."
    )
    adversarial_temperature: float | None = Field(
        None,
        gt=0,
        description="Self-adversarial weights softmax(alpha * score(neg)) instead of a plain mean "
        "(Sun et al., 2019); unset: uniform weights.",
    )


class SoftmaxLossConfig(ConfigModel):
    """Cross-entropy of the positive against its negatives: -log softmax(scores)[positive]."""

    kind: Literal["softmax"] = "softmax"


KGELossConfig = Annotated[
    MarginRankingLossConfig | LogisticLossConfig | SoftmaxLossConfig, Field(discriminator="kind")
]


class RegularizationConfig(ConfigModel):
    """A penalty on the embedding rows used by each positive triple (h, r and t)."""

    kind: Literal["l2", "n3"] = Field(
        ...,
        description="l2 = weight * sum of squares; n3 = weight * sum of |x|^3 (Lacroix et al., "
        "2018; moduli of complex numbers for ComplEx and RotatE).",
    )
    weight: float = Field(..., ge=0, description="Weight of the penalty per positive.")


class EvaluationConfig(ConfigModel):
    """Filtered link prediction: rank the true entity among all entities, both sides."""

    batch_size: int = Field(256, ge=1, description="Triples ranked at once (bounds memory).")
    filtered: bool = Field(
        True, description="Leave every other known true triple out of the ranking (Bordes 2013)."
    )
    hits_at: list[Annotated[int, Field(ge=1)]] = Field(
        [1, 3, 10], min_length=1, description="Report hits@k for these k."
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
    )


class KGETaskConfig(ConfigModel):
    """Link prediction: learn entity and relation embeddings from (head, relation, tail) triples."""

    type: Literal["kge"] = "kge"
    data: KGEDataConfig = Field(
        ..., description="The triples: source = builtin (name = ...) | files (train = ...)."
    )
    model: KGEModelConfig = Field(
        ..., description="Scoring model: type = transe | distmult | complex | rotate."
    )
    dim: int = Field(
        200, ge=2, description="Real numbers per entity row (complex models: dim/2 complex)."
    )
    negatives: NegativeSamplingConfig = Field(
        default_factory=NegativeSamplingConfig, description="Negative sampling."
    )
    loss: KGELossConfig = Field(
        default_factory=MarginRankingLossConfig,
        description="Loss: kind = margin_ranking | logistic | softmax.",
    )
    regularization: RegularizationConfig | None = Field(
        None, description="Penalty on the rows used per batch: kind = l2 | n3."
    )
    evaluation: EvaluationConfig = Field(
        default_factory=EvaluationConfig, description="Filtered ranking evaluation."
    )
    sparse_gradients: bool = Field(
        False,
        description="Row gradients as sparse tensors: the optimizer (sparse_adam, adagrad or sgd "
        "without momentum) updates only the rows a batch used. Strategy local only.",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_tags(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("data"), dict):
            source = "builtin" if "name" in data["data"] else "files"
            data = fill_default_tag(data, "data", "source", source)
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            data = {**data, "model": {"type": data["model"]}}
        data = fill_default_tag(data, "loss", "kind", "margin_ranking")
        return data

    @model_validator(mode="after")
    def _check(self) -> KGETaskConfig:
        if self.model.type in ("complex", "rotate") and self.dim % 2:
            raise ValueError(
                f"dim must be even for {self.model.type} (dim/2 complex numbers), got {self.dim}"
            )
        return self
