"""tensor_parallel, fully_sharded and hybrid reproduce local (AdamW, weight decay, clipping).

The loss is a sum divided by the global batch size and every layout computes the
same sums in another order, so after k steps the parameters agree with one
process's to float rounding (gathered from the DCP pieces of the final checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import shoal
from shoal.checkpoint.sharded import plain_model_state
from shoal.errors import JobFailed, TrainingHalted
from shoal.monitor.metrics import read_metrics
from shoal.report import write_report
from tests.report.page import read_page
from tests.tasks.lm.helpers import assert_same_norms, lm_job, write_text

STEPS = 6
EVERY_STEP = {"log_every_steps": 1}  # the gradient norm of every step in metrics.jsonl


def final_model(results: dict[str, Any]) -> dict[str, torch.Tensor]:
    folder = Path(results["checkpoint"])
    state = torch.load(folder / "state.pt", weights_only=True)
    return plain_model_state(folder, state["model"])


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    assert a.keys() == b.keys()
    off = {n: float((a[n] - b[n]).abs().max()) for n in a}
    assert max(off.values()) <= atol, {n: d for n, d in off.items() if d > atol}


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text(tmp_path_factory.mktemp("spmd-text"))


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory, text: Path) -> dict[str, Any]:
    runs = tmp_path_factory.mktemp("spmd-local")
    job = lm_job(runs, text, train={"max_steps": STEPS}, run={"name": "local"}, monitor=EVERY_STEP)
    return shoal.train(job)


@pytest.mark.parametrize(
    "strategy",
    [
        {"type": "tensor_parallel", "degree": 2},
        {"type": "tensor_parallel", "degree": 2, "sequence_parallel": True},
        {"type": "fully_sharded", "degree": 2},
        {"type": "hybrid", "mesh": {"data": 2, "tensor": 2}},
        {"type": "hybrid", "mesh": {"data": 2, "tensor": 2}, "data": "replicated"},
    ],
    ids=["tp2", "tp2-sp", "fsdp2", "data2xtensor2", "data2xtensor2-replicated"],
)
def test_equals_local(
    strategy: dict[str, Any], local: dict[str, Any], text: Path, tmp_path: Path
) -> None:
    job = lm_job(
        tmp_path / "runs", text, strategy=strategy, train={"max_steps": STEPS}, monitor=EVERY_STEP
    )
    results = shoal.train(job)
    assert results["steps"] == STEPS and results["strategy"] == strategy["type"]
    assert_same(final_model(local), final_model(results), atol=2e-5)
    assert_same_norms(local, results)
    assert results["valid"]["loss"] == pytest.approx(local["valid"]["loss"], abs=1e-4)
    ranks = results["memory"]["per_rank"]
    assert len(ranks) == results["world_size"]
    assert all(r["state_bytes"] > 0 and r["peak_rss_bytes"] > 0 for r in ranks)
    _assert_model_parallel_figures(results, strategy)


def _assert_model_parallel_figures(results: dict[str, Any], strategy: dict[str, Any]) -> None:
    """metrics.jsonl holds every rank's compute, gradient-sync and optimizer seconds and peak
    memory; the report's model-parallel panel draws them per rank beside the state bytes."""
    world = results["world_size"]
    run_dir = Path(results["run_dir"])
    train = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["event"] == "train"]
    assert train
    # each sample counted once, however many tensor ranks compute on it (8 a step)
    assert sum(r["samples"] for r in train) == results["steps"] * 8
    for record in train:
        for r in range(world):
            assert record[f"rank{r}_forward_backward_s"] > 0 and record[f"rank{r}_peak_mb"] > 10
            if strategy.get("data") == "replicated":  # the data dimension's all-reduce
                assert record[f"rank{r}_comm_s"] > 0
    page = read_page(write_report([run_dir], run_dir / "report.html").read_text())
    panel = page.panels["model_parallel"]
    assert {f"rank {r}" for r in range(world)} <= set(panel.text)
    assert "gradient sync (after backward)" in panel.text
    assert panel.svgs == 2 and panel.drawn >= 2 * world  # the time split and peak memory
    assert panel.rows == world  # results.json's state bytes per rank


def test_nonfinite_gradient_halts_naming_rank_parameter_and_coordinates(
    text: Path, tmp_path: Path
) -> None:
    """A NaN in rank 3's gradient of a data 2 x tensor 2 mesh (replicated data: found before
    the data dimension's reduction) halts every rank, naming rank 3 and its coordinates."""
    strategy = {"type": "hybrid", "mesh": {"data": 2, "tensor": 2}, "data": "replicated"}
    job = lm_job(tmp_path / "runs", text, strategy=strategy, train={"max_steps": STEPS})
    job["faults"] = {"inject": {"rank": 3, "step": 2, "kind": "nan"}}
    with pytest.raises((TrainingHalted, JobFailed)) as caught:
        shoal.train(job)
    message = str(caught.value)
    assert "training halted at step 2: non-finite gradients (NaN/Inf) on rank 3 (" in message
    assert "embed.tok.weight [data 1, tensor 1]" in message
