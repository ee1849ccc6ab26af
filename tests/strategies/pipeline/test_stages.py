"""A rank's stages joined into one module named as the full model (interleaved schedules)."""

from __future__ import annotations

import copy

import pytest
import torch

from shoal.strategies.pipeline.stages import join_stages
from shoal.tasks.lm.config import LMModelConfig
from shoal.tasks.lm.model import build_lm


def test_joined_stages_carry_the_full_models_names_of_their_own_copies() -> None:
    """Stages 0 and 2 of four (a rank's under interleaved 1F1B), copied as a hybrid mesh
    copies them before laying them out: the join names each parameter as the full model
    does and holds the copies' tensors, not the full model's."""
    torch.manual_seed(0)
    model = build_lm(LMModelConfig(dim=16, heads=2, layers=4, context=8), 11)
    stages = [copy.deepcopy(model.stage(0, 0)), copy.deepcopy(model.stage(2, 2))]
    joined = join_stages(stages)
    full = dict(model.named_parameters())
    names = [n for n, _ in joined.named_parameters()]
    expected = [n for n in full if n.startswith(("embed.", "blocks.0.", "blocks.2."))]
    assert sorted(names) == sorted(expected)
    mine = {id(p) for s in stages for p in s.parameters()}
    assert {id(p) for p in joined.parameters()} == mine
    for name, param in joined.named_parameters():
        assert torch.equal(param, full[name])
    # the stages themselves are unchanged: stage 0 still holds only block 0
    assert list(stages[0].get_submodule("blocks")) == ["0"]


def test_two_stages_holding_the_same_module_are_refused() -> None:
    model = build_lm(LMModelConfig(dim=16, heads=2, layers=2, context=8), 11)
    with pytest.raises(ValueError, match="both hold 'embed'"):
        join_stages([model.stage(0, 0), model.stage(0, 1)])
