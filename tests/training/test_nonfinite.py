"""Halt on non-finite gradients (seed 004's Jidoka), or skip the step and count it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import shoal
from shoal.checkpoint.manager import list_checkpoints, load_checkpoint
from shoal.errors import EXIT_HALTED, TrainingHalted
from shoal.training.nonfinite import (
    GradientCheck,
    describe_nonfinite,
    is_finite,
    nonfinite_names,
)
from tests.conftest import final_state, run_shoal, small_job

JOB = """
[task]
type = "classification"
[task.data]
samples = 2000
[task.model]
hidden = [16]
[train]
epochs = 20
batch_size = 64
[strategy]
type = "data_parallel"
num_replicas = 3
[checkpoint]
every_steps = 5
[monitor]
progress = "off"
[faults.inject]
rank = 2
step = 7
kind = "nan"
"""


def test_nan_on_rank_2_at_step_7_halts_every_rank(tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(JOB)
    done = run_shoal("train", "job.toml", cwd=tmp_path, timeout=120)
    assert done.returncode == EXIT_HALTED == 3, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(
        "training halted at step 7: non-finite gradients (NaN/Inf) on rank 2 (1.weight);"
    ), lines[0]
    assert 'train.on_nonfinite = "skip_step"' in lines[0]
    run = tmp_path / "runs" / "job"
    for rank in range(3):  # every rank stopped at step 7, before its optimizer step
        report = json.loads((run / "logs" / f"rank-{rank}.error.json").read_text())
        assert report["type"] == "TrainingHalted" and report["step"] == 7, report
    checkpoints = list_checkpoints(run / "checkpoints")
    assert [p.name for p in checkpoints] == ["step-00000005"], "the last good one stays newest"
    state, meta = load_checkpoint(checkpoints[-1])  # verifies its checksum
    assert meta["step"] == 5
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    assert not (run / "results.json").exists()


def test_skip_step_skips_the_update_and_counts_it(runs: Path) -> None:
    inject = {"inject": {"rank": 0, "step": 3, "kind": "nan"}}
    train = {"on_nonfinite": "skip_step"}
    skipped = shoal.train(small_job(runs, train=train, faults=inject))
    assert skipped["skipped_steps"] == 1 and skipped["steps"] == 26
    state = final_state(skipped)
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    assert state["progress"]["skipped_steps"] == 1
    # the same job halts by default, in-process too, with the halt's own error type
    with pytest.raises(TrainingHalted, match="at step 3: non-finite gradients"):
        shoal.train(small_job(runs, faults=inject))


def test_finiteness_checks() -> None:
    assert is_finite(torch.zeros(0)) and is_finite(torch.ones(5))
    assert not is_finite(torch.tensor([1.0, float("nan")]))
    assert not is_finite(torch.tensor([float("inf"), -float("inf")]))
    assert is_finite(torch.full((4,), 3e38)), "a sum that overflows is not a non-finite entry"
    named = [("a", torch.ones(2)), ("b", torch.tensor([float("inf")])), ("c", None)]
    assert nonfinite_names(named) == ["b"]
    # one pass over every tensor (by device and dtype), in the order given; a norm that
    # overflows is checked entry by entry; a sparse gradient by its values
    nan_rows = torch.sparse_coo_tensor([[0, 3]], torch.tensor([[1.0], [float("nan")]]), (5, 1))
    named = [
        ("huge", torch.full((4,), 3e38)),
        ("double", torch.tensor([1.0, float("-inf")], dtype=torch.float64)),
        ("empty", torch.zeros(0)),
        ("sparse", nan_rows),
        ("fine", torch.ones(3, dtype=torch.float64)),
        ("nan", torch.tensor([float("nan")])),
    ]
    assert nonfinite_names(named) == ["double", "sparse", "nan"]
    assert nonfinite_names([("huge", torch.full((4,), 3e38))]) == []
    # the squared norm: a sparse gradient's repeated rows summed first (1 + 2 at row 0)
    repeated = torch.sparse_coo_tensor([[0, 0, 3]], torch.tensor([[1.0], [2.0], [4.0]]), (5, 1))
    check = GradientCheck([("dense", torch.tensor([3.0, 4.0])), ("sparse", repeated)])
    assert check.read(with_square=True) == ([], 25.0 + 9.0 + 16.0)
    # an overflowed square, summed again in float64
    huge = GradientCheck([("huge", torch.full((4,), 3e38))]).read(with_square=True)
    assert huge == ([], pytest.approx(4 * 3e38**2, rel=1e-6))
    bad = {2: ["w", "b"], 0: [f"p{i}" for i in range(6)]}
    assert describe_nonfinite(bad) == "rank 0 (p0, p1, p2, p3 and 2 more); rank 2 (w, b)"
