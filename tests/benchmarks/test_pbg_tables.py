"""benchmarks/kge_vs_pbg.py ranks PyTorch-BigGraph's trained tables with shoal's evaluator:
the TransE that holds them must score every candidate as PBG's model does."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from kge_vs_pbg import TablesTransE

E, R, D = 7, 3, 5


def l2(lhs: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """PBG's `l2` comparator: minus the Euclidean distance."""
    return -torch.linalg.vector_norm(lhs - rhs, dim=-1)


def scores(model: torch.nn.Module, anchor: int, relation: int, tail_side: bool) -> torch.Tensor:
    """shoal's ranking path: the query of (anchor, relation) against every entity."""
    rows = model.entity_rows(torch.tensor([anchor]))
    rel = model.relation_rows(torch.tensor([relation]))
    query = model.tail_query(rows, rel) if tail_side else model.head_query(rows, rel)
    return model.score_all(query, model.all_entities(), 1 << 20)[0]


@pytest.mark.parametrize("dynamic", [True, False])
def test_tables_score_as_pbg(dynamic: bool) -> None:
    rng = np.random.default_rng(0)
    entity = rng.normal(size=(E, D)).astype(np.float32)
    rhs = rng.normal(size=(R, D)).astype(np.float32)  # a_r: f_r(v) = v + a_r
    lhs = rng.normal(size=(R, D)).astype(np.float32)  # b_r: g_r(u) = u + b_r (dynamic only)
    # pbg_model's wiring: tail queries by the lhs operator (static: the rhs one), heads by rhs
    model = TablesTransE.build(entity, lhs if dynamic else -rhs, -rhs)
    e, a, b = torch.from_numpy(entity), torch.from_numpy(rhs), torch.from_numpy(lhs)
    for r in range(R):
        for x in range(E):
            # tail candidates t': dynamic c(g_r(x), t'); static c(x, f_r(t'))
            expected = l2(e[x] + b[r], e) if dynamic else l2(e[x], e + a[r])
            assert torch.allclose(scores(model, x, r, tail_side=True), expected, atol=1e-5)
            # head candidates h': c(h', f_r(x)) in both modes
            expected = l2(e, e[x] + a[r])
            assert torch.allclose(scores(model, x, r, tail_side=False), expected, atol=1e-5)
