"""Initial rows as a function of (key, table, row id): distributions, and independence
from which rows are asked for together."""

from __future__ import annotations

import math

import pytest
import torch

from shoal.tasks.kge import row_init
from shoal.tasks.kge.config import ComplExConfig, DistMultConfig, RotatEConfig, TransEConfig
from shoal.tasks.kge.model_config import XavierNormalInit
from shoal.tasks.kge.models import build_kge_model
from shoal.tasks.kge.row_init import RowInit, initial_rows, table_key


def test_a_row_is_the_same_whichever_rows_are_asked_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows asked one by one, shuffled, or in blocks of another size equal the whole table."""
    init = RowInit.gaussian(0.5, 2.0)
    whole = initial_rows(7, torch.arange(1000), 12, init)
    order = torch.randperm(1000, generator=torch.Generator().manual_seed(3))
    assert torch.equal(initial_rows(7, order, 12, init), whole[order])
    assert torch.equal(initial_rows(7, torch.tensor([999]), 12, init), whole[999:])
    monkeypatch.setattr(row_init, "BLOCK_ENTRIES", 37)  # blocks of 3 rows
    assert torch.equal(initial_rows(7, torch.arange(1000), 12, init), whole)
    assert not torch.equal(initial_rows(8, torch.arange(1000), 12, init), whole)  # the key


def test_the_distributions() -> None:
    ids = torch.arange(20_000)
    uniform = initial_rows(1, ids, 50, RowInit.uniform(-0.2, 1.0))
    assert -0.2 <= uniform.min() < -0.199 and 0.999 < uniform.max() <= 1.0
    assert uniform.mean().item() == pytest.approx(0.4, abs=0.002)
    assert uniform.var().item() == pytest.approx(1.2**2 / 12, rel=0.01)
    normal = initial_rows(2, ids, 50, RowInit.gaussian(0.3, 0.01))
    assert normal.mean().item() == pytest.approx(0.3, abs=1e-4)
    assert normal.std().item() == pytest.approx(0.01, rel=0.01)
    kurtosis = ((normal - 0.3) / 0.01).pow(4).mean().item()
    assert kurtosis == pytest.approx(3.0, abs=0.05)  # a normal's, not a uniform's 1.8
    sphere = initial_rows(3, ids, 50, RowInit.uniform(-1.0, 1.0, unit_norm=True))
    torch.testing.assert_close(sphere.norm(dim=1), torch.ones(len(ids)))
    # neighbouring entries and rows are uncorrelated
    flat = uniform.flatten() - 0.4
    assert abs((flat[1:] * flat[:-1]).mean().item()) < 0.002
    assert abs((uniform[1:, 0] - 0.4).mul(uniform[:-1, 0] - 0.4).mean().item()) < 0.004


def test_tables_have_keys_of_their_own() -> None:
    assert table_key(5, "entity") != table_key(5, "relation") != table_key(6, "relation")


@pytest.mark.parametrize(
    "config",
    [TransEConfig(), DistMultConfig(), ComplExConfig(), RotatEConfig(init=XavierNormalInit())],
    ids=["transe", "distmult", "complex", "rotate-xavier"],
)
def test_the_seed_set_before_building_decides_the_tables(config: object) -> None:
    """A model built with its tables and one built on the meta device, after the same
    seed: the second computes any rows of the first; another seed gives other tables."""
    torch.manual_seed(11)
    model = build_kge_model(config, 300, 4, 8, gamma=6.0)
    torch.manual_seed(11)
    with torch.device("meta"):
        shapes = build_kge_model(config, 300, 4, 8, gamma=6.0)
    assert shapes.entity.weight.is_meta
    ids = torch.tensor([299, 0, 17])
    for table, weight in model.tables().items():
        assert torch.equal(
            shapes.initial_rows(table, ids[ids < len(weight)]), weight[ids[ids < len(weight)]]
        )
    torch.manual_seed(12)
    other = build_kge_model(config, 300, 4, 8, gamma=6.0)
    assert not torch.equal(other.entity.weight, model.entity.weight)


def test_xavier_takes_the_fans_of_the_whole_table() -> None:
    rows = build_kge_model(DistMultConfig(init=XavierNormalInit(gain=2.0)), 4000, 3, 50, 0.0)
    std = 2.0 * math.sqrt(2.0 / (4000 + 50))
    assert rows.entity.weight.std().item() == pytest.approx(std, rel=0.02)
