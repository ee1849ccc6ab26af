"""A dead or hung rank under tensor_parallel, fully_sharded and hybrid ends the job within
the heartbeat timeout, naming the rank and its mesh coordinates (as the pipeline names a
stage). Small models, a 3 s heartbeat timeout: a few seconds each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import shoal
from shoal.errors import JobFailed
from tests.tasks.lm.helpers import lm_job, write_text

MODEL = {"dim": 32, "heads": 4, "layers": 2, "context": 16}


@pytest.mark.parametrize(
    ("strategy", "rank", "named"),
    [
        pytest.param(  # the 2x2 meshes below name the same way (suite budget)
            {"type": "tensor_parallel", "degree": 2},
            1,
            r"rank 1 \(tensor 1\)",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            {"type": "fully_sharded", "degree": 2}, 0, r"rank 0 \(data 0\)", marks=pytest.mark.slow
        ),
        (
            {"type": "hybrid", "mesh": {"data": 2, "tensor": 2}},
            3,
            r"rank 3 \(data 1, tensor 1\)",
        ),
        (
            {"type": "hybrid", "mesh": {"data": 2, "pipeline": 2}, "microbatches": 2},
            2,
            r"rank 2 \(data 1, pipeline 0\)",
        ),
    ],
    ids=["tp2", "fsdp2", "data2xtensor2", "data2xpipeline2"],
)
def test_a_hung_rank_ends_the_job_naming_it_and_its_coordinates(
    strategy: dict[str, Any], rank: int, named: str, tmp_path: Path
) -> None:
    text = write_text(tmp_path)
    job = lm_job(tmp_path / "runs", text, strategy=strategy, task={"model": MODEL})
    job["train"]["drop_last"] = True
    job["faults"] = {"inject": {"rank": rank, "step": 2, "kind": "hang"}, "heartbeat_timeout_s": 3}
    with pytest.raises(JobFailed, match=named + " stopped responding"):
        shoal.train(job)


def test_a_dead_rank_ends_the_job_naming_it_and_its_coordinates(tmp_path: Path) -> None:
    text = write_text(tmp_path)
    strategy = {"type": "hybrid", "mesh": {"pipeline": 2, "tensor": 2}, "microbatches": 2}
    job = lm_job(tmp_path / "runs", text, strategy=strategy, task={"model": MODEL})
    job["train"]["drop_last"] = True
    job["faults"] = {"inject": {"rank": 1, "step": 2, "kind": "exit"}, "heartbeat_timeout_s": 3}
    with pytest.raises(JobFailed, match=r"rank 1 \(pipeline 0, tensor 1\) (exited|failed)"):
        shoal.train(job)
