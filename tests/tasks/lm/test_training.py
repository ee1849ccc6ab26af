"""Training the lm task: the loss is per token, N workers reproduce one, resume is exact."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import shoal
from shoal.checkpoint.manager import list_checkpoints
from shoal.errors import ConfigError, DataError, JobFailed
from shoal.tasks.lm.tokenizer import TOKENIZER_FILE, Tokenizer
from tests.conftest import data_parallel, final_state, one_worker_context
from tests.tasks.lm.helpers import lm_job, write_text


def test_data_parallel_reproduces_local_and_the_loss_falls(runs: Path, tmp_path: Path) -> None:
    """AdamW with weight decay and clipping by the global norm; 7 windows per step split 4 + 3."""
    text = write_text(tmp_path)
    common = {"train": {"max_steps": 20, "batch_size": 7}, "monitor": {"log_every_steps": 1}}
    local = shoal.train(lm_job(runs, text, **common, run={"name": "local"}))
    dp = shoal.train(lm_job(runs, text, **common, strategy=data_parallel(2), run={"name": "dp"}))
    a, b = final_state(local)["model"], final_state(dp)["model"]
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=2e-6, msg=name)
    assert local["valid"]["loss"] == pytest.approx(dp["valid"]["loss"], abs=1e-5)
    losses = [
        r["loss"]
        for r in map(json.loads, (runs / "local" / "metrics.jsonl").read_text().splitlines())
        if r["event"] == "train"
    ]
    vocab = Tokenizer.load(runs / "local" / TOKENIZER_FILE).vocab_size
    assert losses[0] == pytest.approx(math.log(vocab), rel=0.1), "starts near uniform"
    assert sum(losses[-3:]) / 3 < losses[0] - 0.5, f"the loss falls: {losses}"
    assert local["valid"]["perplexity"] == pytest.approx(math.exp(local["valid"]["loss"]))


def test_loss_is_the_mean_per_token(runs: Path, tmp_path: Path) -> None:
    """loss_sum / windows is the mean cross-entropy over every target of the batch."""
    from shoal.tasks.lm.task import LMTask

    ctx = one_worker_context(lm_job(runs, write_text(tmp_path)))
    task = LMTask(ctx)
    torch.manual_seed(0)
    model = task.build_model()
    task.set_epoch(0)
    batch = task.train_batch(torch.tensor([3, 0, 5]))
    out = task.loss(model, batch)
    logits = model(batch[:, :-1])
    expected = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    assert out.count == 3
    torch.testing.assert_close(out.loss_sum / out.count, expected)


def test_resume_is_exact_and_checkpoints_carry_the_tokenizer(runs: Path, tmp_path: Path) -> None:
    """A run that crashes at step 8 and resumes from step 5 ends bit-identical (dropout on)."""
    text = write_text(tmp_path)
    common = {
        "train": {"max_steps": 12, "warmup_steps": 3, "lr_decay": "cosine"},
        "task": {"model": {"dim": 32, "heads": 4, "layers": 2, "context": 16, "dropout": 0.1}},
        "checkpoint": {"every_steps": 5},
    }
    full = shoal.train(lm_job(runs, text, **common, run={"name": "full"}))
    with pytest.raises((JobFailed, RuntimeError), match="injected fault at step 8"):
        shoal.train(
            lm_job(
                runs, text, **common, run={"name": "cut"}, faults={"inject": {"rank": 0, "step": 8}}
            )
        )
    for checkpoint in list_checkpoints(runs / "cut" / "checkpoints"):
        saved = (checkpoint / TOKENIZER_FILE).read_text()
        assert saved == (runs / "cut" / TOKENIZER_FILE).read_text()
    resumed = shoal.train(resume=runs / "cut")
    assert resumed["steps"] == 12
    a, b = final_state(resumed)["model"], final_state(full)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run ends bit-identical"
    assert resumed["valid"] == full["valid"]
    # without its only "q", the text would give a smaller vocabulary: the run keeps its own
    text.write_text(text.read_text().replace("q", "k"))
    with pytest.raises(ConfigError, match=r"task\.data\.train"):
        shoal.train(resume=runs / "cut", overrides=["train.max_steps=14"])
    longer = shoal.train(resume=runs / "cut", overrides=["train.max_steps=14"], allow_changes=True)
    assert longer["steps"] == 14 and longer["data"]["vocab_size"] == full["data"]["vocab_size"]
    text.write_text(text.read_text() + "#")
    with pytest.raises(DataError, match="character '#' is not in this run's vocabulary"):
        shoal.train(resume=runs / "cut", overrides=["train.max_steps=16"], allow_changes=True)
    with pytest.raises(ConfigError, match=r"task\.model\.layers"):
        shoal.train(resume=runs / "cut", overrides=["task.model.layers=3"], allow_changes=True)
