"""Red team: checkpoints that lie, are half there, or hold more than they say.

A checkpoint is trusted only when meta.json (sealed by its own checksum) covers
every file of the folder and every file matches; anything else is refused with
one message. A folder without meta.json is never skipped silently, and no
checkpoint is logged for a save that did not produce a complete folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import shoal
from shoal.checkpoint.integrity import STATE_FILE
from shoal.checkpoint.manager import list_checkpoints, load_checkpoint
from shoal.checkpoint.space import DiskFull
from shoal.errors import ConfigError, ShoalError
from shoal.monitor.metrics import read_metrics
from tests.conftest import run_shoal, small_job
from tests.hostile.tamper import edit_meta, flip_bytes, snapshot

CORRUPT = r"checkpoint is corrupt \(.+\); resume from an earlier one"


def _finished(runs: Path, **sections: Any) -> Path:
    return Path(shoal.train(small_job(runs, **sections))["run_dir"])


def _no_checksums(folder: Path) -> None:
    flip_bytes(folder / STATE_FILE)  # the case: 16 flipped bytes, no checksums left
    edit_meta(folder, lambda meta: meta.pop("sha256"))


def _no_checksums_unsealed(folder: Path) -> None:
    flip_bytes(folder / STATE_FILE)
    edit_meta(folder, lambda meta: meta.pop("sha256"), reseal=False)


def _uncovered_file(folder: Path) -> None:
    (folder / "extra.pt").write_bytes(b"not named by meta.json")


def _entry_removed(folder: Path) -> None:
    flip_bytes(folder / STATE_FILE)
    edit_meta(folder, lambda meta: meta["sha256"].pop(STATE_FILE))


def _named_file_missing(folder: Path) -> None:
    edit_meta(folder, lambda meta: meta["sha256"].update({"shard.pt": "0" * 64}))


def _meta_edited(folder: Path) -> None:
    edit_meta(folder, lambda meta: meta.update(step=1), reseal=False)


CASES: dict[str, Callable[[Path], None]] = {
    "checksums removed": _no_checksums,
    "checksums removed, meta not resealed": _no_checksums_unsealed,
    "a file no checksum covers": _uncovered_file,
    "a checksum entry removed": _entry_removed,
    "a named file missing": _named_file_missing,
    "meta edited": _meta_edited,
    "flipped bytes": lambda folder: flip_bytes(folder / STATE_FILE),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_checkpoint_that_is_not_fully_verifiable_is_refused(runs: Path, case: str) -> None:
    run = _finished(runs)
    CASES[case](list_checkpoints(run / "checkpoints")[-1])
    before = snapshot(run)
    with pytest.raises(ShoalError, match=CORRUPT) as refused:
        shoal.train(resume=run)
    assert len(refused.value.lines) == 1
    assert snapshot(run) == before


def test_the_refusal_is_one_line_on_the_command_line(runs: Path, tmp_path: Path) -> None:
    run = _finished(runs)
    _no_checksums(list_checkpoints(run / "checkpoints")[-1])
    done = run_shoal("train", "--resume", str(run), cwd=tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "checkpoint is corrupt (meta.json has no checksums)" in done.stderr


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_a_resealed_checkpoint_with_pickled_code_is_not_unpickled(
    runs: Path, tmp_path: Path
) -> None:
    """Checksums say the bytes are the ones written, not that they are safe: loading stays
    weights_only, so a forged state.pt that would run code is refused."""
    run = _finished(runs)
    folder = list_checkpoints(run / "checkpoints")[-1]
    marker = tmp_path / "code-ran"
    torch.save({"model": _Evil(marker)}, folder / STATE_FILE)
    digest = hashlib.sha256((folder / STATE_FILE).read_bytes()).hexdigest()
    edit_meta(folder, lambda meta: meta["sha256"].update({STATE_FILE: digest}))
    with pytest.raises(ShoalError, match=r"state\.pt holds objects other than tensors"):
        shoal.train(resume=run)
    assert not marker.exists()


def test_a_step_folder_without_meta_is_named_not_skipped(runs: Path) -> None:
    """The newest folder lost its meta.json: the resume is refused, naming it and the newest
    complete checkpoint; once the folder is moved away, the resume uses that one."""
    run = _finished(runs, checkpoint={"every_steps": 10})
    newest = run / "checkpoints" / "step-00000026"
    (newest / "meta.json").unlink()
    with pytest.raises(ShoalError) as refused:
        shoal.train(resume=run)
    message = str(refused.value)
    assert len(refused.value.lines) == 1
    assert f"{newest}: not a checkpoint (no meta.json" in message
    assert "the newest complete checkpoint is" in message and "step-00000020" in message
    kept = run.parent / "kept-step-00000026"
    newest.rename(kept)
    resumed = shoal.train(resume=run)
    assert resumed["steps"] == 26 and (kept / STATE_FILE).is_file()


def test_a_failed_save_logs_no_checkpoint_and_leaves_no_folder(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills while the second checkpoint is written: no event, no step folder, no
    temporary folder left, and the first checkpoint still verifies."""
    real_save = torch.save
    saves = []

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        saves.append(f)
        if len(saves) == 2:
            raise OSError(28, "No space left on device")
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    config = small_job(runs, checkpoint={"every_steps": 10, "keep_best": False})
    with pytest.raises(DiskFull, match="checkpoint of step 20 not written: the disk holding"):
        shoal.train(config)  # named as a full disk, in one line
    monkeypatch.setattr(torch, "save", real_save)
    run = runs / "run"
    events = [r for r in read_metrics(run / "metrics.jsonl") if r["event"] == "checkpoint"]
    assert [e["step"] for e in events] == [10]
    assert sorted(os.listdir(run / "checkpoints")) == ["step-00000010"]
    load_checkpoint(run / "checkpoints" / "step-00000010")


def test_a_step_saved_again_is_replaced_not_logged_stale(runs: Path) -> None:
    """Resumed from step 10 of a finished run and extended (a longer cosine schedule), the run
    saves steps that exist already: each folder then holds the resumed run's state."""
    run = _finished(
        runs,
        train={"lr_decay": "cosine"},
        checkpoint={"every_steps": 5, "keep_last": 10},
    )
    shoal.train(resume=run / "checkpoints" / "step-00000010", overrides=["train.epochs=3"])
    events = [r for r in read_metrics(run / "metrics.jsonl") if r["event"] == "checkpoint"]
    assert [e["step"] for e in events][-6:] == [15, 20, 25, 30, 35, 39]
    for step in (15, 20, 25):
        state, _ = load_checkpoint(run / "checkpoints" / f"step-{step:08d}")
        assert state["scheduler"]["lr_lambdas"][0]["total_steps"] == 39, step


@pytest.fixture(scope="module")
def ps_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.strategies.parameter_server.test_jobs import job, ps
    from tests.tasks.kge.planted import write_planted_graph

    root = tmp_path_factory.mktemp("ps")
    graph = {name: str(path) for name, path in write_planted_graph(root).items()}
    return Path(shoal.train(job(root / "runs", graph, "ps", strategy=ps()))["run_dir"])


@pytest.mark.parametrize("case", ["uncovered", "flipped"])
def test_parameter_server_shard_files_are_covered(ps_run: Path, tmp_path: Path, case: str) -> None:
    run = tmp_path / "ps"
    shutil.copytree(ps_run, run)
    folder = list_checkpoints(run / "checkpoints")[-1]
    shard = "ps-shard-001-of-002.pt"
    if case == "uncovered":
        edit_meta(folder, lambda meta: meta["sha256"].pop(shard))
        expected = f"{shard} is not covered by meta.json's checksums"
    else:
        flip_bytes(folder / shard)
        expected = f"{shard} does not match its checksum"
    with pytest.raises(ShoalError, match=CORRUPT) as refused:
        shoal.train(resume=run)
    assert expected in str(refused.value)


def test_a_format_1_checkpoint_still_resumes_and_is_still_checked(runs: Path) -> None:
    """Checkpoints written before the seal (format 1: checksums, no config in meta.json) are
    read when their checksums cover every file; their config comes from state.pt."""
    run = _finished(runs)
    folder = list_checkpoints(run / "checkpoints")[-1]

    def as_format_1(meta: dict[str, Any]) -> None:
        for key in ("meta_sha256", "config", "data", "train_size"):
            meta.pop(key, None)
        meta["format"] = 1

    edit_meta(folder, as_format_1, reseal=False)
    with pytest.raises(ConfigError, match=r"^task\.model\.hidden: cannot change"):
        shoal.train(resume=run, overrides=["task.model.hidden=[8]"])
    assert shoal.train(resume=run, overrides=["train.epochs=3"])["steps"] == 39
    older = list_checkpoints(run / "checkpoints")[0]
    edit_meta(older, as_format_1, reseal=False)
    (older / "notes.txt").write_text("not covered")
    with pytest.raises(ShoalError, match=r"notes\.txt is not covered"):
        shoal.train(resume=older)
