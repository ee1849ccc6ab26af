"""hybrid meshes with a pipeline dimension reproduce local; their DCP checkpoints resume.

Four gloo ranks (eight for the slow 3-D mesh), a 4-block lm, AdamW with weight decay,
clipping by the global norm, warm-up then cosine decay; dropout 0 where runs are compared with `local` (each stage
draws dropout from its own rank's generator), 0.1 for the exact resume.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import shoal
from shoal.checkpoint.manager import list_checkpoints
from shoal.checkpoint.sharded import SHARDED_DIR
from shoal.errors import JobFailed, TrainingHalted
from shoal.monitor.metrics import read_metrics
from shoal.shape.roles import RankRoles
from tests.strategies.spmd.test_equivalence import assert_same, final_model
from tests.tasks.lm.helpers import assert_same_norms, lm_job, write_text

COMMON: dict[str, Any] = {
    "train": {
        "max_steps": 4,
        "batch_size": 8,
        "drop_last": True,
        "warmup_steps": 2,
        "lr_decay": "cosine",
        "grad_clip_norm": 0.5,
    },
    "task": {"model": {"dim": 32, "heads": 4, "layers": 4, "context": 16}},
    "monitor": {"log_every_steps": 1},
}


def hybrid(mesh: dict[str, int], **fields: Any) -> dict[str, Any]:
    return {"type": "hybrid", "mesh": mesh, "microbatches": 2, **fields}


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text(tmp_path_factory.mktemp("mesh-text"))


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory, text: Path) -> dict[str, Any]:
    runs = tmp_path_factory.mktemp("mesh-local")
    return shoal.train(lm_job(runs, text, **COMMON, run={"name": "local"}))


def held_mib(results: dict[str, Any], rank: int) -> float:
    """The MiB of parameters `rank` logged holding once its model was ready."""
    log = (Path(results["run_dir"]) / "logs" / f"rank-{rank}.log").read_text()
    found = re.search(r"model ready: ([\d.]+) MiB of parameters on this rank", log)
    assert found is not None, log
    return float(found.group(1))


@pytest.mark.parametrize(
    "strategy",
    [
        hybrid({"data": 2, "pipeline": 2}),
        hybrid({"data": 2, "pipeline": 2}, data="replicated", schedule="gpipe"),
        hybrid({"pipeline": 2, "tensor": 2}, partitions=[[0, 0], [1, 3]]),
        # two virtual stages a rank (4 stages of one block): slow, 4 processes
        pytest.param(
            hybrid({"data": 2, "pipeline": 2}, schedule="interleaved_1f1b"),
            marks=pytest.mark.slow,
        ),
        pytest.param(
            hybrid(
                {"data": 2, "pipeline": 2},
                data="replicated",
                schedule="interleaved_1f1b",
                partitions=[[0, 0], [1, 1], [2, 2], [3, 3]],
            ),
            marks=pytest.mark.slow,
        ),
        # a 3-D mesh: 8 processes on this machine's 2 cores, slow
        pytest.param(
            hybrid({"data": 2, "pipeline": 2, "tensor": 2}, partitions=[[0, 1], [2, 3]]),
            marks=pytest.mark.slow,
        ),
    ],
    ids=[
        "data2xpipeline2",
        "data2xpipeline2-replicated-gpipe",
        "pipeline2xtensor2",
        "data2xpipeline2-interleaved",
        "data2xpipeline2-replicated-interleaved",
        "data2xpipeline2xtensor2",
    ],
)
def test_equals_local(
    strategy: dict[str, Any], local: dict[str, Any], text: Path, tmp_path: Path
) -> None:
    results = shoal.train(lm_job(tmp_path / "runs", text, **COMMON, strategy=strategy))
    world = math.prod(strategy["mesh"].values())
    assert results["steps"] == 4 and results["world_size"] == world
    assert_same(final_model(local), final_model(results), atol=2e-5)
    assert_same_norms(local, results)
    assert results["valid"]["loss"] == pytest.approx(local["valid"]["loss"], abs=1e-5)
    assert results["train"]["loss"] == pytest.approx(local["train"]["loss"], abs=1e-5)
    section = results["pipeline"]
    assert section["mesh"] == strategy["mesh"] and len(section["ranks"]) == world
    # loop placement along the pipeline coordinate: stages r, r + 2 under interleaving
    held = [[0, 2], [1, 3]] if strategy.get("schedule") == "interleaved_1f1b" else [[0], [1]]
    roles = RankRoles.mesh(world, strategy["mesh"])
    expected = [held[roles.coordinates(rank)["pipeline"]] for rank in range(world)]
    assert [r["stages"] for r in section["ranks"]] == expected
    if "partitions" in strategy:
        assert section["partition"] == strategy["partitions"]
    train = [
        r for r in read_metrics(Path(results["run_dir"]) / "metrics.jsonl") if r["event"] == "train"
    ]
    assert sum(r["samples"] for r in train) == 4 * 8, "each sample counted once (4 steps of 8)"
    # each rank holds its stages (laid out over the other dimensions), not the whole model:
    # the ranks hold one copy of it between them (replicated data: one a replica)
    whole = held_mib(local, 0)
    held = [held_mib(results, rank) for rank in range(world)]
    copies = strategy["mesh"]["data"] if strategy.get("data") == "replicated" else 1
    assert all(0 < mib < 0.8 * whole for mib in held), (held, whole)
    assert sum(held) <= copies * whole * 1.05, (held, whole)  # tensor: norms on each rank
    if copies == 1:
        assert all(mib < 0.65 * whole for mib in held), (held, whole)


def test_resume_is_exact_at_the_same_mesh(text: Path, tmp_path: Path) -> None:
    """data 2 x pipeline 2 crashes at step 6, resumes from step 4 (each rank's stage pieces
    in the DCP folder) and ends bit-identical, dropout on (the partition pinned: a balanced
    one is measured again on resume)."""
    runs = tmp_path / "runs"
    common = {
        "train": {**COMMON["train"], "max_steps": 8},
        "task": {"model": {**COMMON["task"]["model"], "dropout": 0.1}},
        "checkpoint": {"every_steps": 4},
    }
    strategy = hybrid({"data": 2, "pipeline": 2}, partitions=[[0, 1], [2, 3]])
    full = shoal.train(lm_job(runs, text, **common, strategy=strategy, run={"name": "full"}))
    cut = lm_job(runs, text, **common, strategy=strategy, run={"name": "cut"})
    cut["faults"] = {"inject": {"rank": 3, "step": 6}}
    with pytest.raises((JobFailed, RuntimeError), match="injected fault at step 6"):
        shoal.train(cut)
    saved = list_checkpoints(runs / "cut" / "checkpoints")[-1]
    assert saved.name == "step-00000004"
    assert (saved / SHARDED_DIR / ".metadata").is_file()
    resumed = shoal.train(resume=runs / "cut")
    assert resumed["steps"] == 8
    a, b = final_model(resumed), final_model(full)
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run ends bit-identical"
    assert resumed["valid"] == full["valid"]


def test_a_pipeline_mesh_checkpoint_resumes_under_local(text: Path, tmp_path: Path) -> None:
    """pipeline 2 x tensor 2's step-4 checkpoint resumes under local, which trains on from
    the saved parameters and optimizer state as the mesh did (both end alike)."""
    runs = tmp_path / "runs"
    common = {**COMMON, "train": {**COMMON["train"], "max_steps": 6}}
    common["checkpoint"] = {"every_steps": 4}
    strategy = hybrid({"pipeline": 2, "tensor": 2})
    through = shoal.train(lm_job(runs, text, **common, strategy=strategy, run={"name": "pt"}))
    step4 = runs / "pt" / "checkpoints" / "step-00000004"
    resumed = shoal.train(resume=step4, overrides=['strategy={ type = "local" }'])
    assert resumed["strategy"] == "local" and resumed["steps"] == 6
    logs = (runs / "pt" / "logs" / "rank-0.log").read_text()
    assert 'resuming with a change of strategy.type: the checkpoint holds "hybrid"' in logs
    assert_same(final_model(resumed), final_model(through), atol=2e-5)


def test_nonfinite_gradient_halts_naming_rank_parameter_and_coordinates(
    text: Path, tmp_path: Path
) -> None:
    """A NaN in rank 2's gradient of data 2 x pipeline 2 (replicated: found before the data
    dimension's reduction) halts every rank, naming rank 2, its coordinates and the first
    stage's parameter."""
    strategy = hybrid({"data": 2, "pipeline": 2}, data="replicated")
    job = lm_job(tmp_path / "runs", text, **COMMON, strategy=strategy)
    job["faults"] = {"inject": {"rank": 2, "step": 2, "kind": "nan"}}
    with pytest.raises((TrainingHalted, JobFailed)) as caught:
        shoal.train(job)
    message = str(caught.value)
    assert "non-finite gradients (NaN/Inf) on rank 2 (data 1, pipeline 0) (" in message
    assert "embed.tok.weight [data 1, pipeline 0]" in message
