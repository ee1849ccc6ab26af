"""Checkpoints of interleaved 1F1B on a mesh: each rank saves two stages' pieces through DCP.

`hybrid` with `{ data = 2, pipeline = 2 }` and `schedule = "interleaved_1f1b"` puts
four one-block stages on a pipeline of two ranks, stages r and r + 2 on pipeline
rank r, joined under the full model's names (`stages.join_stages`) for the
optimizer, the gradient sync and DCP. These tests check that the joined stages
round-trip through a checkpoint: the run resumes bit-identical at the same mesh
(dropout on, so every rank's generator comes back too), and its checkpoint resumes
under local and under fully_sharded 2, which train on from the same parameters and
optimizer state (ending where the mesh ends).

Four gloo ranks, a 4-block lm, AdamW with weight decay, clipping, warm-up then cosine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import shoal
from shoal.checkpoint.manager import list_checkpoints
from shoal.checkpoint.sharded import SHARDED_DIR
from tests.strategies.spmd.test_equivalence import assert_same, final_model
from tests.tasks.lm.helpers import lm_job, write_text

INTERLEAVED: dict[str, Any] = {
    "type": "hybrid",
    "mesh": {"data": 2, "pipeline": 2},
    "schedule": "interleaved_1f1b",
    "microbatches": 2,
    "partitions": [[0, 0], [1, 1], [2, 2], [3, 3]],  # pinned: a balanced one is re-measured
}
TRAIN: dict[str, Any] = {
    "batch_size": 8,
    "drop_last": True,
    "warmup_steps": 2,
    "lr_decay": "cosine",
    "grad_clip_norm": 0.5,
}
MODEL: dict[str, Any] = {"dim": 32, "heads": 4, "layers": 4, "context": 16}


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text(tmp_path_factory.mktemp("interleaved-text"))


def test_resume_is_exact_at_the_same_mesh(text: Path, tmp_path: Path) -> None:
    """8 steps straight, then again from the step-4 checkpoint: bit-identical parameters
    and the same validation figures, dropout on."""
    job = lm_job(
        tmp_path / "runs",
        text,
        strategy=INTERLEAVED,
        train={**TRAIN, "max_steps": 8},
        task={"model": {**MODEL, "dropout": 0.1}},
        checkpoint={"every_steps": 4},
        run={"name": "mesh"},
    )
    full = shoal.train(job)
    straight = final_model(full)  # read now: the resume writes step 8 again
    step4 = list_checkpoints(tmp_path / "runs" / "mesh" / "checkpoints")[0]
    assert step4.name == "step-00000004"
    pieces = sorted(p.name for p in (step4 / SHARDED_DIR).iterdir())
    assert pieces == [".metadata", *(f"__{r}_0.distcp" for r in range(4))], "every rank's pieces"
    assert final_model_keys(step4) == straight.keys(), "the full model's names, every block"
    resumed = shoal.train(resume=step4)
    assert resumed["steps"] == 8
    again = final_model(resumed)
    assert all(torch.equal(again[k], straight[k]) for k in straight), "bit-identical"
    assert resumed["valid"] == full["valid"]


def final_model_keys(checkpoint: Path) -> set[str]:
    return set(final_model({"checkpoint": str(checkpoint)}))


@pytest.fixture(scope="module")
def through(tmp_path_factory: pytest.TempPathFactory, text: Path) -> tuple[Path, dict[str, Any]]:
    """The mesh's run of 6 steps (dropout 0, so other layouts can follow it) and its final
    model, read before any resume rewrites step 6."""
    runs = tmp_path_factory.mktemp("interleaved-through")
    job = lm_job(
        runs,
        text,
        strategy=INTERLEAVED,
        train={**TRAIN, "max_steps": 6},
        task={"model": MODEL},
        checkpoint={"every_steps": 4},
        run={"name": "mesh"},
    )
    results = shoal.train(job)
    return runs / "mesh", final_model(results)


@pytest.mark.parametrize(
    ("name", "table"),
    [("local", '{ type = "local" }'), ("fully_sharded", '{ type = "fully_sharded", degree = 2 }')],
)
def test_resumes_under_another_strategy_from_the_same_parameters(
    name: str, table: str, through: tuple[Path, dict[str, Any]]
) -> None:
    """The step-4 checkpoint resumes under `name`, logs the change, and trains steps 5-6
    as the mesh did (equal to 2e-5: the same maths, another order of sums)."""
    run, expected = through
    resumed = shoal.train(
        resume=run / "checkpoints" / "step-00000004", overrides=[f"strategy={table}"]
    )
    assert resumed["strategy"] == name and resumed["steps"] == 6
    log = (run / "logs" / "rank-0.log").read_text()
    assert (
        f'resuming with a change of strategy.type: the checkpoint holds "hybrid", asked "{name}"'
        in log
    )
    assert_same(final_model(resumed), expected, atol=2e-5)
