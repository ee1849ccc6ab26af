"""`task.loss` and `task.regularization`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from shoal.config.base import ConfigModel


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
    """Cross-entropy of the positive against its candidates: -log softmax(scores)[positive].

    Negative sampling: against its negatives (LibKGE's `kl`); 1vsAll: against every entity;
    KvsAll: cross-entropy with the query's (smoothed) answers as the target distribution.
    """

    kind: Literal["softmax"] = "softmax"


class BCELossConfig(ConfigModel):
    """Binary cross-entropy on every scored candidate, summed (LibKGE's `bce`).

    Each positive counts as label 1 and each negative (or non-answer) as label 0:
    softplus(-(s + offset)) for a label 1, softplus(s + offset) for a label 0, and
    y softplus(-(s + offset)) + (1 - y) softplus(s + offset) for a smoothed label y.
    """

    kind: Literal["bce"] = "bce"
    offset: float = Field(0.0, description="Added to every score (LibKGE's loss_arg).")


KGELossConfig = Annotated[
    MarginRankingLossConfig | LogisticLossConfig | SoftmaxLossConfig | BCELossConfig,
    Field(discriminator="kind"),
]


class RegularizationConfig(ConfigModel):
    """A penalty weight * sum |x|^p on embedding entries.

    weighted = true (the default): on the rows each training sample uses, once per use, so
    a row is penalised in proportion to its frequency in the training data (LibKGE's
    `regularize_args.weighted`). weighted = false: on every row of both tables, once per
    optimizer step. LibKGE's formula divides by p: a LibKGE `regularize_weight` w is
    `weight = w / p` here.
    """

    kind: Literal["l2", "n3", "lp"] = Field(
        ...,
        description="l2 = sum of squares; n3 = sum of |x|^3 (Lacroix et al., 2018; moduli of "
        "complex numbers for ComplEx and RotatE); lp = sum of |x|^p over the real entries.",
    )
    weight: float = Field(..., ge=0, description="Weight of the penalty on entity rows.")
    relation_weight: float | None = Field(
        None, ge=0, description="Weight of the penalty on relation rows (unset: `weight`)."
    )
    p: float | None = Field(None, ge=1, description="The exponent of kind = lp (default 2).")
    weighted: bool = Field(
        True,
        description="true: the rows each sample uses, per use (frequency-weighted); false: "
        "every row of both tables once per step (not with sparse gradients or a parameter "
        "server, which see only the rows a batch uses).",
    )

    @property
    def exponent(self) -> float:
        return {"l2": 2.0, "n3": 3.0}.get(self.kind, 2.0 if self.p is None else self.p)

    @model_validator(mode="after")
    def _p_only_for_lp(self) -> RegularizationConfig:
        if self.kind != "lp" and self.p is not None:
            raise ValueError(f"p is the exponent of kind = 'lp'; kind = {self.kind!r} fixes it")
        return self
