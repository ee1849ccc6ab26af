"""The scoring models: TransE, DistMult, ComplEx and RotatE, over explicit embedding rows.

Every model is two tables (entities, relations) plus maths on *rows* of them.
Training takes the path a sparse table serves: gather the rows a batch uses
(`entity_rows`, `relation_rows`: the only place the tables are read), score,
and backward leaves gradients on exactly those rows. A parameter server replaces
the two gathers with pulls and pushes the rows' gradients; the maths is unchanged.
The tables are `nn.Embedding`s with dense gradients by default, so `local` and
`data_parallel` (which sums dense gradient buckets) train them as they are; with
`sparse = True` a gather's backward yields sparse row gradients instead, which
row-wise optimizers (sparse_adam, adagrad, sgd) apply to the used rows only.

Scores are written as a *query* matched against *candidates*: for tail prediction
the query is built from (h, r) and matched against every candidate tail; for
head prediction from (r, t) and matched against every candidate head. For all
four models this split is exact (TransE: h + r vs t, or t - r vs h; RotatE:
h o r vs t, or t o conj(r) vs h since |r| = 1; ComplEx: h o r vs t, or
conj(r) o t vs h), so one positive's own score, its shared negatives and a
ranking against all entities use the same `match`: a matrix product for the
bilinear models, a pairwise distance for the translational ones.

Options every model takes (`ModelOptions`): reciprocal relations give the
relation table a second half, row r + R for relation r read backwards, and every
head query (?, r, t) becomes the tail query (t, r^-1, ?) (`relation_ids` and
`queries` say which rows and which query a side uses); embedding dropout applies
to rows as a score uses them, only in training mode; `init` replaces the paper's
initialisation of the tables.

A model declares its initialisation (`row_inits`: a distribution per table) rather
than drawing it: the rows are a function of (model key, table, row id)
(`row_init.py`), so a parameter server builds only the rows it owns, and they are
the rows one process starts from.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from shoal.plugins.kinds import KGE_MODELS
from shoal.tasks.kge.config import KGEModelConfig
from shoal.tasks.kge.model_config import (
    ComplExConfig,
    DistMultConfig,
    InitConfig,
    ModelOptions,
    RotatEConfig,
    TransEConfig,
)
from shoal.tasks.kge.rotate_distance import rotate_distances
from shoal.tasks.kge.row_init import RowInit, from_config, initial_rows, table_key

_TINY = 1e-30  # below this a squared modulus is clamped: sqrt stays differentiable at 0


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A complex row stored as [real parts, imaginary parts]."""
    k = x.shape[-1] // 2
    return x[..., :k], x[..., k:]


def _complex_modulus(x: torch.Tensor) -> torch.Tensor:
    re, im = _halves(x)
    return (re * re + im * im).clamp_min(_TINY).sqrt()


class RowSource(Protocol):
    """Where a model reads its rows when the tables live elsewhere (a parameter server)."""

    num_relations: int

    def rows(self, table: str, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of table "entity" or "relation" (with gradients where training)."""
        ...

    def entity_blocks(self) -> Iterator[torch.Tensor]:
        """Every entity row, raw, in id order, a bounded block at a time (for ranking)."""
        ...


def dropout(rows: torch.Tensor, p: float) -> torch.Tensor:
    """Inverted dropout: each entry kept with probability 1 - p and scaled by 1 / (1 - p).

    One 15-bit random number per entry, drawn 4 to an int64 from torch's generator (so
    checkpoints capture it): p is rounded to a multiple of 2^-15 (and the scale uses the
    rounded value, so the expectation is exact). torch's own dropout draws a float per
    entry through bernoulli_, which on CPU took 3 to 10 times longer and was the largest
    cost of a LibKGE-style step (dropout on every negative's row).
    """
    threshold = round(p * 32768)
    if threshold == 0:
        return rows
    words = torch.empty((rows.numel() + 3) // 4, dtype=torch.int64, device=rows.device).random_()
    bits = words.view(torch.int16)[: rows.numel()].view(rows.shape) & 0x7FFF
    keep = bits >= threshold
    return torch.where(keep, rows * (32768.0 / (32768 - threshold)), 0.0)


class KGEModel(nn.Module, ABC):
    """Entity and relation tables and a score function defined on their rows.

    `num_relations` counts the data's relations; with reciprocal relations the
    relation table has twice as many rows (`relation_rows`). The base of every KG
    model, plugins' too (entry-point group `shoal.kge_models`, whose entry point names
    the config class, a `ModelOptions`; the config's `implementation` names the model).
    """

    config_class: ClassVar[type[ModelOptions]] = ModelOptions
    #: what `model.json` says of the exported embeddings
    formula: ClassVar[str] = "see the model's documentation"
    layout: ClassVar[str] = "real rows of width dim"
    #: whether training may compile this model's side scoring (`compiled_scoring.py`): its
    #: queries and matches are plain torch ops, with no state changed while scoring
    compiled_scoring: ClassVar[bool] = False

    @classmethod
    def from_config(
        cls, config: Any, num_entities: int, num_relations: int, dim: int, gamma: float
    ) -> KGEModel:
        """The model for `config` (its `config_class`); `gamma` is the loss margin, which
        RotatE's initialisation reads. Override when the constructor takes other arguments."""
        model: KGEModel = cls(config, num_entities, num_relations, dim)  # type: ignore[call-arg]
        return model

    def __init__(
        self,
        num_entities: int,
        num_relations: int,
        entity_width: int,
        relation_width: int,
        options: ModelOptions,
    ) -> None:
        super().__init__()
        #: the key of the initial rows (on CPU even under a meta-device build, so a model
        #: built for its shapes draws the same key as one built with its tables)
        self.init_key = int(torch.randint(0, 2**62, (1,), device="cpu").item())
        self.num_relations = num_relations
        self.reciprocal = options.reciprocal
        self.entity_dropout = options.entity_dropout
        self.relation_dropout = options.relation_dropout
        relations = relation_table_rows(num_relations, options)
        # storage only (no draw): `reset_rows` writes the initial rows
        self.entity = nn.Embedding(
            num_entities, entity_width, _weight=torch.empty(num_entities, entity_width)
        )
        self.relation = nn.Embedding(
            relations, relation_width, _weight=torch.empty(relations, relation_width)
        )
        self.row_inits: dict[str, RowInit] = {
            "entity": RowInit.gaussian(0.0, 1.0),
            "relation": RowInit.gaussian(0.0, 1.0),
        }
        self.sparse = False  # set by the task: gathers then give sparse row gradients
        self.served: RowSource | None = None

    def initialize(self, init: InitConfig) -> None:
        """Replace the paper's initialisation of both tables by `init`."""
        for table, weight in self.tables().items():
            self.row_inits[table] = from_config(init, int(weight.shape[0]), int(weight.shape[1]))

    def tables(self) -> dict[str, torch.Tensor]:
        """The tables by name (meta tensors for a model built for its shapes)."""
        return {"entity": self.entity.weight, "relation": self.relation.weight}

    def initial_rows(self, table: str, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of `table` ("entity" or "relation") as the model starts, float32:
        the same for whichever process computes them (`row_init.py`)."""
        width = int(self.tables()[table].shape[1])
        return initial_rows(table_key(self.init_key, table), ids, width, self.row_inits[table])

    @torch.no_grad()
    def reset_rows(self) -> None:
        """Write every row's initial value into the tables (nothing on the meta device)."""
        for table, weight in self.tables().items():
            if not weight.is_meta:
                ids = torch.arange(weight.shape[0])
                weight.copy_(self.initial_rows(table, ids))

    def serve_tables(self, source: RowSource) -> None:
        """Read rows from `source` from now on and drop the local tables (a parameter-server
        worker holds only the rows it pulled; the model then has no parameters)."""
        self.served = source
        self._modules["entity"] = None
        self._modules["relation"] = None

    # ------------------------------------------------------------ the tables (gather rows)
    def entity_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of entities `ids` as the score uses them (a gather: row gradients)."""
        if self.served is not None:
            return self.prepare_entities(self.served.rows("entity", ids))
        return self.prepare_entities(F.embedding(ids, self.entity.weight, sparse=self.sparse))

    def relation_rows(self, ids: torch.Tensor) -> torch.Tensor:
        if self.served is not None:
            return self.served.rows("relation", ids)
        return F.embedding(ids, self.relation.weight, sparse=self.sparse)

    def prepare_entities(self, rows: torch.Tensor) -> torch.Tensor:
        """A transformation of gathered entity rows before scoring (TransE: unit length)."""
        return rows

    def all_entities(self) -> torch.Tensor:
        """Every entity row as scored: the candidates of a ranking."""
        return self.prepare_entities(self.entity.weight)

    # ------------------------------------------------------------ sides and options
    def relation_ids(self, relations: torch.Tensor, head: bool | torch.Tensor) -> torch.Tensor:
        """The relation rows a query of side `head` reads: r, or r + R (its reciprocal) for a
        head query when relations are reciprocal. `head` is one side or one per query."""
        if not self.reciprocal:
            return relations
        if isinstance(head, bool):
            return relations + self.num_relations if head else relations
        return relations + head.long() * self.num_relations

    def queries(
        self, anchor: torch.Tensor, relation: torch.Tensor, head: bool | torch.Tensor
    ) -> torch.Tensor:
        """What the candidates of side `head` are matched against, from the anchor's rows and
        the rows `relation_ids` named: head queries are tail queries of the reciprocal."""
        if self.reciprocal or head is False:
            return self.tail_query(anchor, relation)
        if head is True:
            return self.head_query(anchor, relation)
        assert isinstance(head, torch.Tensor)
        return torch.where(
            head[:, None], self.head_query(anchor, relation), self.tail_query(anchor, relation)
        )

    def drop_entities(self, rows: torch.Tensor) -> torch.Tensor:
        """Entity dropout (training only)."""
        if self.entity_dropout > 0 and self.training:
            return dropout(rows, self.entity_dropout)
        return rows

    def drop_relations(self, rows: torch.Tensor) -> torch.Tensor:
        """Relation dropout (training only)."""
        if self.relation_dropout > 0 and self.training:
            return dropout(rows, self.relation_dropout)
        return rows

    # ------------------------------------------------------------ the maths (on rows)
    @abstractmethod
    def tail_query(self, head: torch.Tensor, relation: torch.Tensor) -> torch.Tensor:
        """What candidate tails are matched against."""

    @abstractmethod
    def head_query(self, tail: torch.Tensor, relation: torch.Tensor) -> torch.Tensor:
        """What candidate heads are matched against."""

    @abstractmethod
    def match(self, queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Scores of every (query, candidate) pair: (..., n, w) x (..., m, w) -> (..., n, m)."""

    @abstractmethod
    def match_rows(self, queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Scores of aligned pairs: (..., w) x (..., w) -> (...), broadcasting."""

    def match_each(self, queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Each query against its own candidates: (n, w) x (n, K, w) -> (n, K).

        Elementwise rather than n tiny matrix products, which are slow on CPU.
        """
        return self.match_rows(queries.unsqueeze(-2), candidates)

    def score(self, head: torch.Tensor, relation: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
        """The score of each triple, from rows (higher = more plausible)."""
        return self.match_rows(self.tail_query(head, relation), tail)

    def magnitudes(self, rows: torch.Tensor, table: str) -> torch.Tensor | None:
        """The numbers an N3 penalty acts on in rows of `table` ("entity" or "relation"):
        the entries, or the moduli of complex numbers; None: nothing to penalise."""
        return rows

    # ------------------------------------------------------------ evaluation
    def score_all(
        self, queries: torch.Tensor, candidates: torch.Tensor, block_elements: int
    ) -> torch.Tensor:
        """(n, w) queries against all (m, w) candidates, no intermediate above `block_elements`.

        `match` builds no intermediate larger than its output for the bilinear models
        and TransE, so this is `match`; RotatE, whose distance needs an (n, m, k) one,
        overrides it.
        """
        return self.match(queries, candidates)


class TransE(KGEModel):
    """TransE (Bordes et al., 2013): a relation translates the head onto the tail.

    score(h, r, t) = -||h + r - t||_p. Initialisation as in the paper: every row
    U(-6/sqrt(d), 6/sqrt(d)), relation rows then scaled to unit L2 norm; entity
    rows start at unit L2 norm and are scored at unit norm (the paper renormalises
    them every step; here the normalisation is part of the score, so it needs no
    in-place update and its gradient is the projected one). Starting on the sphere
    matters: a row of norm n would move n times slower in direction.
    """

    config_class = TransEConfig
    compiled_scoring = True
    formula = "-||h + r - t||_p"
    layout = "real rows of width dim"

    def __init__(
        self, config: TransEConfig, num_entities: int, num_relations: int, dim: int
    ) -> None:
        super().__init__(num_entities, num_relations, dim, dim, config)
        self.p = config.p
        self.normalize = config.normalize_entities
        bound = 6.0 / math.sqrt(dim) * config.init_scale
        # start on the unit sphere, where the paper keeps entities
        self.row_inits["entity"] = RowInit.uniform(-bound, bound, unit_norm=self.normalize)
        self.row_inits["relation"] = RowInit.uniform(-bound, bound, unit_norm=True)

    def prepare_entities(self, rows: torch.Tensor) -> torch.Tensor:
        return F.normalize(rows, dim=-1) if self.normalize else rows

    def tail_query(self, head: torch.Tensor, relation: torch.Tensor) -> torch.Tensor:
        return head + relation

    def head_query(self, tail: torch.Tensor, relation: torch.Tensor) -> torch.Tensor:
        return tail - relation

    def match(self, queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        if self.p == 1:
            return -torch.cdist(queries, candidates, p=1.0)
        # ||q - c||^2 = |q|^2 + |c|^2 - 2 q.c: a matrix product instead of an (n, m, w) difference
        squared = (
            (queries * queries).sum(dim=-1, keepdim=True)
            + (candidates * candidates).sum(dim=-1).unsqueeze(-2)
            - 2.0 * torch.matmul(queries, candidates.transpose(-1, -2))
        )
        return -squared.clamp_min(_TINY).sqrt()

    def match_rows(self, queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        diff = queries - candidates
        if self.p == 1:
            return -diff.abs().sum(dim=-1)
        return -(diff * diff).sum(dim=-1).clamp_min(_TINY).sqrt()


class DistMult(KGEModel):
    """DistMult (Yang et al., 2015): a diagonal bilinear form, score = sum_i h_i r_i t_i.

    Symmetric in h and t by construction. Rows start Xavier-uniform,
    U(+-sqrt(6 / (2 d))) (a row seen as a d x d layer), times `init_scale`.
    """

    config_class: ClassVar[type[ModelOptions]] = DistMultConfig
    compiled_scoring = True
    formula = "sum_i h_i r_i t_i"
    layout = "real rows of width dim"

    def __init__(
        self, config: DistMultConfig, num_entities: int, num_relations: int, dim: int
    ) -> None:
        super().__init__(num_entities, num_relations, dim, dim, config)
        bound = math.sqrt(6.0 / (2 * dim)) * config.init_scale
        self.row_inits["entity"] = self.row_inits["relation"] = RowInit.uniform(-bound, bound)

    def tail_query(self, head: torch.Tensor, relation: torch.Tensor) -> torch.Tensor:
        return head * relation

    def head_query(self, tail: torch.Tensor, relation: torch.Tensor) -> torch.Tensor:
        return tail * relation

    def match(self, queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        return torch.matmul(queries, candidates.transpose(-1, -2))

    def match_rows(self, queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        return (queries * candidates).sum(dim=-1)


class ComplEx(DistMult):
    """ComplEx (Trouillon et al., 2016): score = Re(sum_i h_i r_i conj(t_i)), complex rows.

    Re(<q, conj(c)>) = q_re . c_re + q_im . c_im, so with rows stored as [re, im]
    matching is DistMult's real dot product; only the queries are complex
    products. Rows start N(0, init_scale^2), as in the paper (init_scale = 1).
    """

    config_class = ComplExConfig
    formula = "Re(sum_i h_i r_i conj(t_i))"
    layout = "complex rows: [real parts (dim/2), imaginary parts (dim/2)]"

    def __init__(
        self, config: ComplExConfig, num_entities: int, num_relations: int, dim: int
    ) -> None:
        KGEModel.__init__(self, num_entities, num_relations, dim, dim, config)
        normal = RowInit.gaussian(0.0, config.init_scale)
        self.row_inits["entity"] = self.row_inits["relation"] = normal

    def tail_query(self, head: torch.Tensor, relation: torch.Tensor) -> torch.Tensor:
        h_re, h_im = _halves(head)
        r_re, r_im = _halves(relation)
        return torch.cat([h_re * r_re - h_im * r_im, h_re * r_im + h_im * r_re], dim=-1)

    def head_query(self, tail: torch.Tensor, relation: torch.Tensor) -> torch.Tensor:
        t_re, t_im = _halves(tail)
        r_re, r_im = _halves(relation)  # conj(r) o t
        return torch.cat([r_re * t_re + r_im * t_im, r_re * t_im - r_im * t_re], dim=-1)

    def magnitudes(self, rows: torch.Tensor, table: str) -> torch.Tensor | None:
        return _complex_modulus(rows)


class RotatE(KGEModel):
    """RotatE (Sun et al., 2019): a relation rotates the head onto the tail in C^k.

    score = -sum_i |h_i r_i - t_i| with r_i = exp(i theta_i), so |r_i| = 1 always:
    relations are stored as phases theta. Initialisation as in the paper: entity
    parts U(+-(gamma + 2) / k) (gamma the loss margin), phases U(-pi, pi).
    """

    config_class = RotatEConfig
    formula = "-sum_i |h_i exp(i theta_i) - t_i|"
    layout = "entities: [real parts (dim/2), imaginary parts (dim/2)]; relations: dim/2 phases"

    @classmethod
    def from_config(
        cls, config: Any, num_entities: int, num_relations: int, dim: int, gamma: float
    ) -> KGEModel:
        return cls(config, num_entities, num_relations, dim, gamma)

    def __init__(
        self,
        config: RotatEConfig,
        num_entities: int,
        num_relations: int,
        dim: int,
        gamma: float,
    ) -> None:
        k = dim // 2
        super().__init__(num_entities, num_relations, dim, k, config)
        bound = (gamma + 2.0) / k * config.init_scale
        self.row_inits["entity"] = RowInit.uniform(-bound, bound)
        self.row_inits["relation"] = RowInit.uniform(-math.pi, math.pi)

    @staticmethod
    def _rotation(phases: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cos(phases), torch.sin(phases)

    def tail_query(self, head: torch.Tensor, relation: torch.Tensor) -> torch.Tensor:
        h_re, h_im = _halves(head)
        cos, sin = self._rotation(relation)
        return torch.cat([h_re * cos - h_im * sin, h_re * sin + h_im * cos], dim=-1)

    def head_query(self, tail: torch.Tensor, relation: torch.Tensor) -> torch.Tensor:
        t_re, t_im = _halves(tail)
        cos, sin = self._rotation(relation)  # t o conj(r)
        return torch.cat([t_re * cos + t_im * sin, t_im * cos - t_re * sin], dim=-1)

    def match(self, queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        # |q_i - c_i| per complex dimension, summed: tiles that stay in cache and a backward
        # of its own (`rotate_distance`); no matrix-product shortcut, whose cancellation
        # would blur close distances
        return rotate_distances(queries, candidates)

    def match_rows(self, queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        return -_complex_modulus(queries - candidates).sum(dim=-1)

    @torch.no_grad()
    def score_all(
        self, queries: torch.Tensor, candidates: torch.Tensor, block_elements: int
    ) -> torch.Tensor:
        """Ranking scores (no autograd) in blocks of candidates, through two reused buffers.

        Scoring every entity needs |q_i - c_i| for all (n, m, k): that is cut in blocks
        of candidates whose (n, block, k) real and imaginary differences each stay under
        `block_elements`. The buffers are allocated once and written in place: a fresh
        temporary per block (as `match` makes) let glibc's heap fragment until one
        evaluation process held 6 to 7 GiB at dim 1000, from one run to the next.
        """
        n, width = queries.shape
        k = width // 2
        block = max(1, min(len(candidates), block_elements // max(1, n * k)))
        q_re, q_im = (part.unsqueeze(1) for part in _halves(queries))
        c_re, c_im = _halves(candidates)
        diff_re = queries.new_empty(n, block, k)
        diff_im = queries.new_empty(n, block, k)
        sums = queries.new_empty(n, block)
        scores = queries.new_empty(n, len(candidates))
        for start in range(0, len(candidates), block):
            stop = min(start + block, len(candidates))
            size = stop - start
            re, im, total = diff_re[:, :size], diff_im[:, :size], sums[:, :size]
            torch.sub(q_re, c_re[start:stop].unsqueeze(0), out=re)
            torch.sub(q_im, c_im[start:stop].unsqueeze(0), out=im)
            re.mul_(re).addcmul_(im, im).sqrt_()  # |q_i - c_i| per complex dimension
            torch.sum(re, dim=-1, out=total)
            scores[:, start:stop] = total
        return scores.neg_()

    def initialize(self, init: InitConfig) -> None:
        """Entities only: relations are phases, U(-pi, pi) whatever the entities' init."""
        rows, width = self.entity.weight.shape
        self.row_inits["entity"] = from_config(init, int(rows), int(width))

    def magnitudes(self, rows: torch.Tensor, table: str) -> torch.Tensor | None:
        if table == "relation":
            return None  # |r_i| = 1: nothing to penalise
        return _complex_modulus(rows)


def relation_table_rows(num_relations: int, options: ModelOptions) -> int:
    """Rows of the relation table: twice the relations with reciprocal relations."""
    return num_relations * (2 if options.reciprocal else 1)


def build_kge_model(
    config: KGEModelConfig, num_entities: int, num_relations: int, dim: int, gamma: float
) -> KGEModel:
    """The model `config` names (shoal's own or a `shoal.kge_models` plugin); `gamma` is the
    loss margin (RotatE's initialisation uses it)."""
    cls: type[KGEModel] = KGE_MODELS.load(config.type)
    model = cls.from_config(config, num_entities, num_relations, dim, gamma)
    if config.init is not None:
        model.initialize(config.init)
    model.reset_rows()
    return model
