"""The transformer: causal, deterministic from the seed, and split into stages by name."""

from __future__ import annotations

import pytest
import torch

from shoal.tasks.lm.config import LMModelConfig
from shoal.tasks.lm.model import build_lm

VOCAB = 23


def _config(**fields: object) -> LMModelConfig:
    return LMModelConfig.model_validate(
        {"dim": 32, "heads": 4, "layers": 4, "context": 16, **fields}
    )


def _model(**fields: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_lm(_config(**fields), VOCAB)


@pytest.mark.parametrize("position", ["learned", "rotary"])
def test_logits_depend_only_on_the_past(position: str) -> None:
    model = _model(position=position).eval()
    tokens = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    changed = tokens.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % VOCAB
    a, b = model(tokens), model(changed)
    assert a.shape == (2, 16, VOCAB)
    torch.testing.assert_close(a[:, :9], b[:, :9])
    assert not torch.allclose(a[:, 9:], b[:, 9:])


def test_position_matters() -> None:
    """A learned table or rotary: the same token at another position gets other logits."""
    for position in ("learned", "rotary"):
        model = _model(position=position).eval()
        logits = model(torch.full((1, 8), 3))
        assert not torch.allclose(logits[0, 1], logits[0, 5])


def test_initialisation_is_a_function_of_the_seed() -> None:
    a, b = _model().state_dict(), _model().state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    out = a["blocks.3.attn.out.weight"].std().item()
    q = a["blocks.3.attn.q.weight"].std().item()
    assert out < q / 2, "residual projections are scaled down by 1/sqrt(2 layers)"


def test_layout_names_for_the_parallel_plans() -> None:
    model = _model(bias=True)
    names = {n for n, _ in model.named_modules()}
    for part in ("attn.q", "attn.k", "attn.v", "attn.out", "mlp.up", "mlp.down", "norm1", "norm2"):
        assert f"blocks.0.{part}" in names
    assert {"embed.tok", "embed.pos", "norm", "head"} <= names
    assert model.get_submodule("blocks.1.mlp.up").out_features == 128  # mlp_ratio 4


def test_stages_compose_to_the_full_model_and_keep_its_names() -> None:
    model = _model(dropout=0.0).eval()
    tokens = torch.randint(0, VOCAB, (3, 16), generator=torch.Generator().manual_seed(2))
    first, middle, last = model.stage(0, 0), model.stage(1, 2), model.stage(3, 3)
    torch.testing.assert_close(last(middle(first(tokens))), model(tokens), rtol=0, atol=0)
    hidden = first(tokens)
    assert hidden.shape == (3, 16, 32), "activations pass between stages as one tensor"
    full = model.state_dict()
    seen: set[str] = set()
    for stage in (first, middle, last):
        for name, tensor in stage.state_dict().items():
            assert tensor is full[name] or torch.equal(tensor, full[name])
            seen.add(name)
    assert seen == set(full), "the stages' state dicts partition the model's"
    assert "embed.tok.weight" in first.state_dict() and "head.weight" in last.state_dict()
    assert not any(n.startswith(("embed", "head", "norm.")) for n in middle.state_dict())


def test_stage_bounds_and_tied_embeddings() -> None:
    with pytest.raises(ValueError, match=r"within 0\.\.3"):
        _model().stage(2, 4)
    tied = _model(tie_embeddings=True)
    assert tied.head.weight is tied.embed.tok.weight
    assert tied.stage(0, 3) is not None
    with pytest.raises(ValueError, match="tie_embeddings = false"):
        tied.stage(0, 1)


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"heads \(5\) must divide dim \(32\)"):
        _config(heads=5)
    with pytest.raises(ValueError, match="even head width"):
        _config(dim=12, heads=4, position="rotary")
