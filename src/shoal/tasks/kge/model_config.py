"""`task.model`: the scoring model, and the options every model shares.

Every model accepts the options of LibKGE's recipe (Ruffinelli et al., 2020, "You CAN
teach an old dog new tricks"): reciprocal relations, embedding dropout and the
initialisation of its tables.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from shoal.config.base import ConfigModel


class UniformInit(ConfigModel):
    """Every entry U(a, b) (torch.nn.init.uniform_)."""

    kind: Literal["uniform"] = "uniform"
    a: float = Field(-1.0, description="Lower bound.")
    b: float = Field(
        1.0,
        description="Upper bound. LibKGE's published configs set only `a`, so their b is "
        "torch's default 1.0 (uma-pi1/kge issue 244).",
    )


class NormalInit(ConfigModel):
    """Every entry N(mean, std^2) (torch.nn.init.normal_)."""

    kind: Literal["normal"] = "normal"
    mean: float = Field(0.0, description="Mean.")
    std: float = Field(1.0, gt=0, description="Standard deviation.")


class XavierUniformInit(ConfigModel):
    """torch.nn.init.xavier_uniform_ on the (rows x width) table, as LibKGE applies it."""

    kind: Literal["xavier_uniform"] = "xavier_uniform"
    gain: float = Field(1.0, gt=0, description="Scaling factor.")


class XavierNormalInit(ConfigModel):
    """torch.nn.init.xavier_normal_ on the (rows x width) table, as LibKGE applies it."""

    kind: Literal["xavier_normal"] = "xavier_normal"
    gain: float = Field(1.0, gt=0, description="Scaling factor.")


InitConfig = Annotated[
    UniformInit | NormalInit | XavierUniformInit | XavierNormalInit, Field(discriminator="kind")
]


class ModelOptions(ConfigModel):
    """Options every model takes."""

    reciprocal: bool = Field(
        False,
        description="Reciprocal relations (Lacroix et al., 2018; Kazemi & Poole, 2018): a second "
        "embedding per relation, so that predicting the head of (?, r, t) is predicting the "
        "tail of (t, r^-1, ?). Training and ranking score every query as a tail query.",
    )
    entity_dropout: float = Field(
        0.0, ge=0, lt=1, description="Dropout on entity rows while training (off in evaluation)."
    )
    relation_dropout: float = Field(
        0.0, ge=0, lt=1, description="Dropout on relation rows while training (off in evaluation)."
    )
    init: InitConfig | None = Field(
        None,
        description="Initialisation of both tables: kind = uniform (a, b) | normal (mean, std) | "
        "xavier_uniform (gain) | xavier_normal (gain). Unset: the model paper's (see init_scale). "
        "RotatE's relation phases stay U(-pi, pi).",
    )


class TransEConfig(ModelOptions):
    """TransE (Bordes et al., 2013): score = -||h + r - t||_p."""

    type: Literal["transe"] = "transe"
    p: Literal[1, 2] = Field(1, description="Norm of the translation distance: 1 or 2.")
    normalize_entities: bool = Field(
        True,
        description="Score with unit-length entity rows, the paper's constraint ||e||_2 = 1 "
        "(applied to the rows as they are used, so it is differentiable).",
    )
    init_scale: float = Field(1.0, gt=0, description="Multiplies the paper's initialisation.")


class DistMultConfig(ModelOptions):
    """DistMult (Yang et al., 2015): score = <h, r, t> = sum_i h_i r_i t_i."""

    type: Literal["distmult"] = "distmult"
    init_scale: float = Field(1.0, gt=0, description="Multiplies the Xavier initialisation.")


class ComplExConfig(ModelOptions):
    """ComplEx (Trouillon et al., 2016): score = Re(<h, r, conj(t)>), complex rows.

    A row of width `dim` holds dim/2 complex numbers: real parts, then imaginary parts.
    """

    type: Literal["complex"] = "complex"
    init_scale: float = Field(
        1.0, gt=0, description="Standard deviation of the normal initialisation (paper: 1)."
    )


class RotatEConfig(ModelOptions):
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
