"""A short last batch under every strategy: trained where the strategy can (replicas), dropped
with one notice where it cannot (a pipeline's fixed micro-batch shapes, FSDP ranks that each
need a sample); never an error that asks for `train.drop_last`. A batch larger than the data
is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from tests.conftest import run_shoal
from tests.tasks.lm.helpers import VERSE, lm_job

#: 545 characters: (545 - 1) // 16 - 1 = 33 windows of context 16, so batches of 8 leave 1
TRAIN_CHARS = 545
SAMPLES = 33


def _job(tmp_path: Path, strategy: dict[str, Any], **train: Any) -> Path:
    text = tmp_path / "train.txt"
    text.write_text((VERSE * 4)[:TRAIN_CHARS], encoding="utf-8")
    (tmp_path / "valid.txt").write_text(VERSE, encoding="utf-8")
    job = lm_job(
        tmp_path / "runs",
        text,
        task={"data": {"train": str(text), "valid": str(tmp_path / "valid.txt")}},
        strategy=strategy,
        train={"epochs": 2, "max_steps": None, "batch_size": 8, **train},
        monitor={"progress": "off"},
        run={"name": "job"},
    )
    job["task"]["data"].pop("split", None)
    job["train"] = {k: v for k, v in job["train"].items() if v is not None}
    path = tmp_path / "job.toml"
    path.write_text(tomli_w.dumps(job))
    return path


@pytest.mark.parametrize(
    "strategy",
    [
        {"type": "pipeline", "stages": 2, "microbatches": 2},
        pytest.param({"type": "fully_sharded", "degree": 2}, marks=pytest.mark.slow),
        pytest.param(
            {"type": "hybrid", "mesh": {"data": 2, "pipeline": 2}, "microbatches": 2},
            marks=pytest.mark.slow,
        ),
    ],
    ids=["pipeline", "fully_sharded", "hybrid"],
)
def test_a_short_last_batch_is_dropped_with_one_notice(
    tmp_path: Path, strategy: dict[str, Any]
) -> None:
    _job(tmp_path, strategy)
    done = run_shoal("train", "job.toml", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    notice = (
        f"the last batch of each epoch (1 of the {SAMPLES} samples) is dropped: "
        f"{strategy['type']} needs at least "
    )
    assert done.stderr.count(notice) == 1, done.stderr
    results = json.loads((tmp_path / "runs" / "job" / "results.json").read_text())
    assert results["steps"] == 2 * (SAMPLES // 8)  # 4 whole batches an epoch


def test_replicas_train_the_short_batch(tmp_path: Path) -> None:
    _job(tmp_path, {"type": "data_parallel", "num_replicas": 2})
    done = run_shoal("train", "job.toml", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "is dropped" not in done.stderr
    results = json.loads((tmp_path / "runs" / "job" / "results.json").read_text())
    assert results["steps"] == 2 * 5


def test_a_batch_larger_than_the_data_is_refused(tmp_path: Path) -> None:
    _job(tmp_path, {"type": "local"}, batch_size=64)
    done = run_shoal("train", "job.toml", cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"train.batch_size (64) exceeds the {SAMPLES} training samples: no step could train "
        f"on a whole batch; set it to at most {SAMPLES}"
    )
