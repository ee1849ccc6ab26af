"""Checkpoints: a crashed and resumed run ends bit-identical to one that never stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import shoal
from shoal.checkpoint.manager import list_checkpoints, load_checkpoint
from shoal.errors import JobFailed, ShoalError
from shoal.runtime.rng import capture_rng, restore_rng
from tests.conftest import data_parallel, final_state, small_job

# dropout, warm-up, cosine decay and Adam: every piece of state matters for exactness
TRAIN = {
    "epochs": 3,
    "optimizer": {"kind": "adam", "lr": 0.01},
    "warmup_steps": 5,
    "lr_decay": "cosine",
}
TASK = {
    "type": "classification",
    "data": {"source": "synthetic", "samples": 500, "features": 10, "informative": 5, "classes": 3},
    "model": {"hidden": [16, 16], "dropout": 0.2},
}


def _assert_identical(a: dict, b: dict) -> None:
    for part in ("model",):
        assert a[part].keys() == b[part].keys()
        for name in a[part]:
            assert torch.equal(a[part][name], b[part][name]), f"{part}.{name} differs"
    assert a["progress"]["global_step"] == b["progress"]["global_step"]
    for index, state in a["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][index][key]), f"optimizer {key}"


@pytest.mark.parametrize("strategy", [{"type": "local"}, data_parallel(2)], ids=["local", "dp2"])
def test_crash_then_resume_is_bit_identical(runs: Path, strategy: dict) -> None:
    common = {"task": TASK, "strategy": strategy, "train": TRAIN, "checkpoint": {"every_steps": 5}}
    full = shoal.train(small_job(runs, **common, run={"name": "full"}))
    with pytest.raises((JobFailed, RuntimeError), match="injected fault at step 23"):
        shoal.train(
            small_job(
                runs,
                **common,
                run={"name": "broken"},
                faults={"inject": {"rank": strategy.get("num_replicas", 1) - 1, "step": 23}},
            )
        )
    broken = runs / "broken"
    steps = [int(p.name.removeprefix("step-")) for p in list_checkpoints(broken / "checkpoints")]
    assert steps[-1] == 20, "the newest checkpoint is the last good one, before the crash"
    assert not (broken / "results.json").exists()
    resumed = shoal.train(resume=broken)
    assert resumed["steps"] == full["steps"] == 39
    _assert_identical(final_state(resumed), final_state(full))
    assert resumed["valid"] == full["valid"]
    records = [json.loads(line) for line in (broken / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "train"][-1] == 39


def test_extended_resume_continues_the_same_run(runs: Path) -> None:
    """Train 2 epochs, then resume with epochs = 4: the same as training 4 epochs at once."""
    long = shoal.train(small_job(runs, train={"epochs": 4}, run={"name": "long"}))
    short = shoal.train(small_job(runs, train={"epochs": 2}, run={"name": "short"}))
    assert short["steps"] == 26
    extended = shoal.train(resume=runs / "short", overrides=["train.epochs=4"])
    assert extended["steps"] == long["steps"] == 52
    _assert_identical(final_state(extended), final_state(long))
    assert "epochs = 4" in (runs / "short" / "config.toml").read_text()


def test_keep_last_and_no_partial_checkpoints(runs: Path) -> None:
    results = shoal.train(small_job(runs, checkpoint={"every_steps": 4, "keep_last": 2}))
    folder = Path(results["run_dir"]) / "checkpoints"
    assert [p.name for p in sorted(folder.iterdir())] == ["step-00000024", "step-00000026"]
    state, meta = load_checkpoint(folder / "step-00000026")
    assert meta["step"] == 26 and state["progress"]["epoch"] == 2
    assert len(state["rng"]) == 1


class _Killed(BaseException):
    """Stands for the process dying (SIGKILL) in the middle of a deletion."""


def test_a_run_killed_while_pruning_resumes_from_its_newest_checkpoint(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the hostile suite under load: a launcher killed while it deleted an old
    checkpoint left `step-*` without meta.json, and resume refused the run as damaged."""
    import shoal.checkpoint.manager as manager

    real_rmtree = manager.shutil.rmtree

    def dies_half_way(path: Path, ignore_errors: bool = False) -> None:
        meta = Path(path) / "meta.json"
        if meta.is_file():  # deleting a whole checkpoint: meta.json goes, then the process
            meta.unlink()
            raise _Killed
        real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(manager.shutil, "rmtree", dies_half_way)
    with pytest.raises(_Killed):
        shoal.train(small_job(runs, checkpoint={"every_steps": 4, "keep_last": 2}))
    monkeypatch.undo()
    run = next(runs.iterdir())
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == [".step-00000004.pruned.tmp", "step-00000008", "step-00000012"], names
    results = shoal.train(resume=str(run))  # the newest complete checkpoint, no refusal
    assert results["steps"] == 26
    assert not list((run / "checkpoints").glob(".step-*")), "the next save removes the remains"


def test_corrupt_checkpoint_is_refused_with_a_clear_message(runs: Path) -> None:
    results = shoal.train(small_job(runs))
    state_file = Path(results["checkpoint"]) / "state.pt"
    data = bytearray(state_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state_file.write_bytes(bytes(data))
    with pytest.raises(ShoalError, match="checkpoint is corrupt"):
        shoal.train(resume=results["run_dir"])


def test_resume_needs_a_checkpoint(runs: Path, tmp_path: Path) -> None:
    with pytest.raises(ShoalError, match="no such run directory"):
        shoal.train(resume=tmp_path / "nothing")
    empty = tmp_path / "empty-run"
    (empty / "checkpoints").mkdir(parents=True)
    with pytest.raises(ShoalError, match="no checkpoint to resume from"):
        shoal.train(resume=empty)


def test_rng_state_round_trip() -> None:
    import random

    import numpy as np

    torch.manual_seed(1)
    blob = capture_rng()
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    restore_rng(blob)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first
