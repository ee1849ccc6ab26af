"""The four scoring models: hand-computed scores, query/candidate identities, gradients."""

from __future__ import annotations

import math

import pytest
import torch

from shoal.plugins.kinds import KGE_MODELS
from shoal.tasks.kge import rotate_distance
from shoal.tasks.kge.config import ComplExConfig, DistMultConfig, RotatEConfig, TransEConfig
from shoal.tasks.kge.model_config import (
    NormalInit,
    UniformInit,
    XavierNormalInit,
    XavierUniformInit,
)
from shoal.tasks.kge.models import KGEModel, build_kge_model

CONFIGS = {
    "transe-l1": TransEConfig(p=1),
    "transe-l2": TransEConfig(p=2),
    "distmult": DistMultConfig(),
    "complex": ComplExConfig(),
    "rotate": RotatEConfig(),
}


def _model(name: str, dim: int = 6, entities: int = 7, relations: int = 3) -> KGEModel:
    torch.manual_seed(0)
    return build_kge_model(CONFIGS[name], entities, relations, dim, gamma=6.0).double()


def _rows(model: KGEModel, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    width_e, width_r = model.entity.weight.shape[1], model.relation.weight.shape[1]
    h = torch.randn(n, width_e, generator=g, dtype=torch.float64)
    r = torch.randn(n, width_r, generator=g, dtype=torch.float64)
    t = torch.randn(n, width_e, generator=g, dtype=torch.float64)
    return h, r, t


def test_every_model_is_registered() -> None:
    assert sorted(KGE_MODELS.names()) == ["complex", "distmult", "rotate", "transe"]


def test_transe_scores_by_hand() -> None:
    l1, l2 = _model("transe-l1", dim=2), _model("transe-l2", dim=2)
    h, r = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    for t, d1, d2 in [
        ([1.0, 1.0], 0.0, 0.0),
        ([0.0, 0.0], 2.0, math.sqrt(2)),
        ([4.0, -3.0], 7.0, 5.0),
    ]:
        tail = torch.tensor([t])
        assert l1.float().score(h, r, tail).item() == pytest.approx(-d1, abs=1e-6)
        assert l2.float().score(h, r, tail).item() == pytest.approx(-d2, abs=1e-6)


def test_distmult_score_by_hand() -> None:
    model = _model("distmult", dim=2).float()
    score = model.score(
        torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0]]), torch.tensor([[5.0, 6.0]])
    )
    assert score.item() == pytest.approx(1 * 3 * 5 + 2 * 4 * 6)


def test_complex_score_by_hand() -> None:
    """h = (1+2i, 3-i), r = (2, i), t = (1+i, 2): Re(sum h r conj(t)) = Re(6+2i) + Re(2+6i) = 8."""
    model = _model("complex", dim=4).float()
    h = torch.tensor([[1.0, 3.0, 2.0, -1.0]])  # [real parts, imaginary parts]
    r = torch.tensor([[2.0, 0.0, 0.0, 1.0]])
    t = torch.tensor([[1.0, 2.0, 1.0, 0.0]])
    assert model.score(h, r, t).item() == pytest.approx(8.0)
    assert model.score(t, r, h).item() != pytest.approx(8.0)  # not symmetric, unlike DistMult


def test_rotate_score_by_hand() -> None:
    """h = (1, i) rotated by (pi/2, 0) is (i, i); t = (i, 1+i): moduli 0 and 1, score -1."""
    model = _model("rotate", dim=4).float()
    h = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    phases = torch.tensor([[math.pi / 2, 0.0]])
    t = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    assert model.score(h, phases, t).item() == pytest.approx(-1.0, abs=1e-6)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_queries_match_the_score_from_both_sides(name: str) -> None:
    """tail_query(h, r) vs t and head_query(t, r) vs h give the triple's score; so do the
    all-pairs and blocked forms used for shared negatives and ranking."""
    model = _model(name)
    h, r, t = _rows(model, 5)
    score = model.score(h, r, t)
    torch.testing.assert_close(model.match_rows(model.head_query(t, r), h), score)
    pairs = model.match(model.tail_query(h, r), t)
    torch.testing.assert_close(torch.diagonal(pairs), score)
    for block_elements in (2, 5 * h.shape[-1]):  # blocks of 1 candidate; of 2, 2 and 1
        blocked = model.score_all(model.tail_query(h, r), t, block_elements=block_elements)
        torch.testing.assert_close(blocked, pairs.detach())
    each = model.match_each(model.tail_query(h, r), t.unsqueeze(0).expand(5, 5, -1))
    torch.testing.assert_close(each, pairs)
    side = torch.tensor([True, False, True, False, False])
    anchor = torch.where(side[:, None], t, h)
    target = torch.where(side[:, None], h, t)
    torch.testing.assert_close(model.match_rows(model.queries(anchor, r, side), target), score)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_numerical_gradient_of_the_score(name: str) -> None:
    model = _model(name)
    h, r, t = (x.requires_grad_() for x in _rows(model, 3))
    assert torch.autograd.gradcheck(lambda a, b, c: model.score(a, b, c), (h, r, t))
    q = model.tail_query(h, r)
    assert torch.autograd.gradcheck(
        lambda a, b: model.match(a, b), (q.detach().requires_grad_(), t)
    )


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_sparse_row_gradients_equal_the_dense_gradient(name: str) -> None:
    """The gather-score-scatter path: a sparse gather's row gradients, scattered, are the
    dense table gradient (what a parameter server would push back)."""
    ids = torch.tensor([0, 3, 3, 5])
    rels = torch.tensor([1, 2])
    grads = {}
    for sparse in (False, True):
        model = _model(name)
        model.sparse = sparse
        rows = model.entity_rows(ids)
        loss = model.score(rows[:2], model.relation_rows(rels), rows[2:]).square().sum()
        loss.backward()
        grad = model.entity.weight.grad
        assert grad is not None and grad.is_sparse == sparse
        grads[sparse] = grad.to_dense() if sparse else grad
    torch.testing.assert_close(grads[True], grads[False])
    assert torch.count_nonzero(grads[True].abs().sum(dim=1)) <= 3  # only rows 0, 3 and 5


def test_paper_initialisations() -> None:
    transe = _model("transe-l1", dim=50)
    bound = 6 / math.sqrt(50)
    assert transe.entity.weight.abs().max() <= bound
    torch.testing.assert_close(
        transe.relation.weight.norm(dim=1), torch.ones(3, dtype=torch.float64)
    )
    torch.testing.assert_close(
        transe.all_entities().norm(dim=1), torch.ones(7, dtype=torch.float64)
    )  # scored at unit length
    rotate = _model("rotate", dim=50)
    assert rotate.entity.weight.abs().max() <= (6.0 + 2.0) / 25
    assert rotate.relation.weight.abs().max() <= math.pi and rotate.relation.weight.shape == (3, 25)


def test_init_options_replace_the_paper_initialisation() -> None:
    """uniform (a, b), normal (mean, std), xavier on the (rows x width) table; RotatE keeps
    its phases in (-pi, pi); reciprocal relations double the relation table."""
    uniform = DistMultConfig(init=UniformInit(a=-0.2, b=1.0), reciprocal=True)
    model = build_kge_model(uniform, 400, 5, 50, gamma=0.0)
    weight = model.entity.weight
    assert model.relation.weight.shape == (10, 50)
    assert -0.2 <= weight.min() < -0.19 and 0.99 < weight.max() <= 1.0
    assert weight.mean().item() == pytest.approx(0.4, abs=0.01)
    normal = build_kge_model(ComplExConfig(init=NormalInit(std=0.01)), 400, 5, 50, gamma=0.0)
    assert normal.entity.weight.std().item() == pytest.approx(0.01, rel=0.05)
    xavier = build_kge_model(TransEConfig(init=XavierUniformInit(gain=2.0)), 400, 5, 50, 0.0)
    bound = 2.0 * math.sqrt(6 / (400 + 50))
    assert bound * 0.95 < xavier.entity.weight.abs().max() <= bound
    rotate = build_kge_model(RotatEConfig(init=XavierNormalInit()), 400, 5, 50, gamma=9.0)
    assert rotate.relation.weight.abs().max() <= math.pi
    assert rotate.relation.weight.abs().max() > 3.0  # still U(-pi, pi), not xavier


@pytest.mark.parametrize(
    ("q_shape", "c_shape", "tile", "compiled"),
    [
        ((3, 70, 40), (3, 50, 40), 1 << 10, False),  # chunks of shared negatives, ragged tiles
        ((3, 70, 40), (3, 50, 40), 1 << 20, False),  # one tile
        ((9, 40), (33, 40), 1 << 9, False),  # queries against every entity (1vsAll)
        ((2, 1, 5, 8), (4, 6, 8), 1 << 6, False),  # broadcast leading dimensions
        ((3, 70, 40), (3, 50, 40), 0, True),  # the compiled kernels (one compilation, ~8 s)
    ],
)
def test_rotate_fast_distances_equal_the_reference(
    q_shape: tuple[int, ...],
    c_shape: tuple[int, ...],
    tile: int,
    compiled: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RotatE.match (compiled kernels, or tiles; own backward) against autograd through the
    plain broadcast -sum_i |q_i - c_i| (match_rows on every pair): the same scores and the
    same gradients for both inputs, including a candidate equal to a query (distance 0:
    gradient 0, not NaN)."""
    monkeypatch.setattr(rotate_distance, "TILE_ELEMENTS", tile or rotate_distance.TILE_ELEMENTS)
    monkeypatch.setattr(rotate_distance.KERNELS, "enabled", compiled)
    monkeypatch.setattr(rotate_distance.KERNELS, "shapes", set())
    model = _model("rotate", dim=q_shape[-1])
    g = torch.Generator().manual_seed(3)
    queries = torch.randn(q_shape, generator=g, dtype=torch.float64)
    candidates = torch.randn(c_shape, generator=g, dtype=torch.float64)
    candidates[..., 0, :] = queries.reshape(-1, q_shape[-1])[0]  # a pair at distance 0
    fast_q, fast_c = queries.clone().requires_grad_(), candidates.clone().requires_grad_()
    ref_q, ref_c = queries.clone().requires_grad_(), candidates.clone().requires_grad_()
    fast = model.match(fast_q, fast_c)
    # every pair aligned by broadcasting, scored by match_rows (the by-hand-tested score)
    reference = model.match_rows(ref_q.unsqueeze(-2), ref_c.unsqueeze(-3))
    torch.testing.assert_close(fast, reference)
    weights = torch.randn(fast.shape, generator=g, dtype=torch.float64)
    (fast * weights).sum().backward()
    (reference * weights).sum().backward()
    torch.testing.assert_close(fast_q.grad, ref_q.grad)
    torch.testing.assert_close(fast_c.grad, ref_c.grad)
    assert fast_q.grad is not None and torch.isfinite(fast_q.grad).all()
    if compiled and not rotate_distance.KERNELS.enabled:
        pytest.skip("torch.compile is not available here: the tiles were used")
    assert bool(rotate_distance.KERNELS.shapes) == compiled  # the path named was the path taken


def test_rotate_compiled_gradient_is_finite_where_a_candidate_meets_its_query_in_float32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Training runs in float32, where a floor of 1e-60 under the squared distance is 0:
    the compiled gradient's rsqrt(0) times a zero difference was NaN, and a RotatE run on
    FB15k-237 halted at its step 317. The tiles give the reference."""
    monkeypatch.setattr(rotate_distance.KERNELS, "enabled", True)
    monkeypatch.setattr(rotate_distance.KERNELS, "shapes", set())
    g = torch.Generator().manual_seed(5)
    queries = torch.randn(2, 24, 16, generator=g)
    candidates = torch.randn(2, 20, 16, generator=g)
    candidates[0, 3, 2] = queries[0, 5, 2]  # one complex dimension where the two meet
    candidates[0, 3, 10] = queries[0, 5, 10]
    candidates[1, 0] = queries[1, 0]  # a whole row
    weights = torch.randn(2, 24, 20, generator=g)
    grads = {}
    for path, compiled in (("compiled", True), ("tiles", False)):
        monkeypatch.setattr(rotate_distance.KERNELS, "enabled", compiled)
        q, c = queries.clone().requires_grad_(), candidates.clone().requires_grad_()
        (rotate_distance.rotate_distances(q, c) * weights).sum().backward()
        assert q.grad is not None and c.grad is not None
        grads[path] = (q.grad, c.grad)
    if not rotate_distance.KERNELS.shapes:
        pytest.skip("torch.compile is not available here: the tiles were used")
    for got, want in zip(grads["compiled"], grads["tiles"], strict=True):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_rotate_evaluation_takes_the_tiles_whatever_it_saw_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only training steps (gradients enabled) use the compiled kernels: evaluation's blocks
    come in many shapes, and a run resumed from a checkpoint must take the same kernel for
    each training shape as the run it continues, whatever shapes either evaluated before."""
    monkeypatch.setattr(rotate_distance.KERNELS, "enabled", True)
    monkeypatch.setattr(rotate_distance.KERNELS, "shapes", set())
    model = _model("rotate", dim=8)
    with torch.no_grad():
        for n in (3, 5, 7):  # shapes the compiled path has never seen
            model.match(torch.randn(2, n, 8), torch.randn(2, 4, 8))
    assert rotate_distance.KERNELS.shapes == set()
