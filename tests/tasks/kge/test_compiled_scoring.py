"""The compiled scoring of negative sampling (compiled_scoring.py) against the eager one: the
same losses and row gradients to float rounding, for the models and losses that declare
their scoring compilable; and the compiled path is taken only where it says (training on
CPU, declared models, the first MAX_SHAPES shapes), with eager running on after a failure.

Each compilation costs seconds (Inductor, C++), so make test compiles one configuration;
the others are `slow`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from shoal.config import load_config
from shoal.tasks.kge import compiled_scoring
from shoal.tasks.kge.config import KGETaskConfig
from shoal.tasks.kge.models import build_kge_model
from shoal.tasks.kge.task import KGETask
from shoal.tasks.kge.training_types import build_training_type
from shoal.tasks.kge.triples import load_kg
from tests.conftest import one_worker_context
from tests.tasks.kge.test_training import kge_job


def _graph(tmp_path: Path) -> Path:
    g = torch.Generator().manual_seed(0)
    lines = []
    for h, r, t in zip(
        torch.randint(0, 40, (120,), generator=g).tolist(),
        torch.randint(0, 3, (120,), generator=g).tolist(),
        torch.randint(0, 40, (120,), generator=g).tolist(),
        strict=True,
    ):
        lines.append(f"e{h}\tr{r}\te{t}")
    path = tmp_path / "train.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


UNIFORM = {"num_negatives": 6, "side": "uniform"}


def _config(
    tmp_path: Path, model: dict[str, Any], loss: dict[str, Any], negatives: dict[str, Any]
) -> Any:
    task = {
        "type": "kge",
        "dim": 8,
        "data": {"train": str(_graph(tmp_path))},
        "model": model,
        "loss": loss,
        "negatives": {**negatives, "chunk_size": 4},
    }
    config = load_config({"task": task, "train": {"epochs": 1, "batch_size": 16}})
    assert isinstance(config.task, KGETaskConfig)
    return config.task


def _loss_and_grads(
    config: KGETaskConfig, compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    monkeypatch.setattr(compiled_scoring.KERNELS, "enabled", compiled)
    data = load_kg(config.data)
    training = build_training_type(config, data, seed=0)
    training.compiled = True  # as the task sets it for a long run
    torch.manual_seed(0)
    model = build_kge_model(config.model, len(data.entities), len(data.relations), 8, 1.0)
    model.reset_rows()
    batch = training.batch(torch.arange(13), torch.device("cpu"))  # a chunk not full
    out = training.loss(model, batch)
    out.loss_sum.backward()
    assert model.entity.weight.grad is not None and model.relation.weight.grad is not None
    return out.loss_sum.detach(), model.entity.weight.grad, model.relation.weight.grad


CASES = [
    pytest.param({"type": "transe", "p": 2}, {"kind": "margin_ranking", "margin": 1.0}, UNIFORM),
    pytest.param(
        {"type": "complex", "reciprocal": True},
        {"kind": "softmax"},
        {"num_negatives_s": 3, "num_negatives_o": 5},
        marks=pytest.mark.slow,
    ),
    pytest.param(
        {"type": "distmult"},
        {"kind": "logistic", "margin": 0.5, "adversarial_temperature": 1.0},
        {"num_negatives": 6, "side": "bernoulli"},
        marks=pytest.mark.slow,
    ),
    pytest.param(
        {"type": "transe", "p": 1}, {"kind": "bce"}, {"num_negatives_s": 4}, marks=pytest.mark.slow
    ),
]


@pytest.mark.parametrize(("model", "loss", "negatives"), CASES)
def test_compiled_step_equals_the_eager_step(
    model: dict[str, Any],
    loss: dict[str, Any],
    negatives: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compiled_scoring.KERNELS, "shapes", set())
    config = _config(tmp_path, model, loss, negatives)
    eager = _loss_and_grads(config, False, monkeypatch)
    assert compiled_scoring.KERNELS.shapes == set()
    fast = _loss_and_grads(config, True, monkeypatch)
    if not compiled_scoring.KERNELS.enabled:
        pytest.skip("torch.compile is not available here: the eager path was used")
    assert compiled_scoring.KERNELS.shapes, "the compiled path was not taken"
    for got, expected in zip(fast, eager, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert eager[1].abs().sum() > 0


def test_auto_compiles_runs_long_enough_to_pay_for_it(runs: Path, tmp_path: Path) -> None:
    """`task.compiled_scoring`: as set, or under "auto" from COMPILE_AFTER_STEPS planned
    steps (the fewer of max_steps and epochs x steps per epoch; no planned end: compile)."""
    after = compiled_scoring.COMPILE_AFTER_STEPS
    assert compiled_scoring.planned("auto", after) and compiled_scoring.planned("auto", None)
    assert not compiled_scoring.planned("auto", after - 1)
    assert compiled_scoring.planned(True, 1) and not compiled_scoring.planned(False, None)
    data = {"train": str(_graph(tmp_path))}  # 120 triples, batch 32: 4 steps an epoch
    for train, setting, compiled in (
        ({"epochs": 30}, "auto", False),
        ({"epochs": after // 4}, "auto", True),
        ({"epochs": after // 4, "max_steps": 100}, "auto", False),
        ({"epochs": 30}, True, True),
        ({"epochs": after}, False, False),
    ):
        job = kge_job(runs, data, task={"compiled_scoring": setting}, train=train)
        task = KGETask(one_worker_context(job))
        assert task.training.compiled is compiled, (train, setting)


def test_compiled_path_only_where_declared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """RotatE (kernels of its own) and evaluation (no gradients) never compile; a shape past
    MAX_SHAPES runs eagerly."""
    monkeypatch.setattr(compiled_scoring.KERNELS, "shapes", set())
    calls: list[Any] = []
    monkeypatch.setattr(torch, "compile", lambda f, **kw: calls.append(f) or f)
    rotate = _config(tmp_path, {"type": "rotate"}, {"kind": "logistic"}, UNIFORM)
    _loss_and_grads(rotate, True, monkeypatch)
    assert calls == [] and compiled_scoring.KERNELS.shapes == set()
    transe = _config(tmp_path, {"type": "transe"}, {"kind": "margin_ranking"}, UNIFORM)
    with torch.no_grad():
        data = load_kg(transe.data)
        training = build_training_type(transe, data, seed=0)
        training.compiled = True
        model = build_kge_model(transe.model, len(data.entities), len(data.relations), 8, 1.0)
        training.loss(model, training.batch(torch.arange(8), torch.device("cpu")))
    assert compiled_scoring.KERNELS.shapes == set()
    monkeypatch.setattr(compiled_scoring.KERNELS, "max_shapes", 0)
    _loss_and_grads(transe, True, monkeypatch)
    assert compiled_scoring.KERNELS.shapes == set()


def test_a_failed_compilation_runs_on_eagerly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No C++ compiler (or any failure of Inductor): one warning, then the eager step, with
    the eager step's numbers."""
    monkeypatch.setattr(compiled_scoring.KERNELS, "shapes", set())
    monkeypatch.setattr(compiled_scoring.KERNELS, "_compiled", {})

    def broken(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(torch, "compile", lambda f, **kw: broken)
    config = _config(tmp_path, {"type": "transe"}, {"kind": "margin_ranking"}, UNIFORM)
    eager = _loss_and_grads(config, False, monkeypatch)
    with caplog.at_level("WARNING"):
        fallen = _loss_and_grads(config, True, monkeypatch)
    assert compiled_scoring.KERNELS.enabled is False
    assert "torch.compile unavailable (no C++ compiler)" in caplog.text
    for got, expected in zip(fallen, eager, strict=True):
        assert torch.equal(got, expected)
