"""Sharded checkpoints (DCP): exact resume, resume under another layout, plain export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import shoal
from shoal.checkpoint.manager import list_checkpoints
from shoal.checkpoint.sharded import SHARDED_DIR, export_model, plain_model_state
from shoal.errors import JobFailed
from shoal.tasks.lm.config import LMModelConfig
from shoal.tasks.lm.model import build_lm
from shoal.tasks.lm.tokenizer import TOKENIZER_FILE, Tokenizer
from tests.strategies.spmd.test_equivalence import final_model
from tests.tasks.lm.helpers import lm_job, write_text

FSDP2 = {"type": "fully_sharded", "degree": 2}
TP2 = {"type": "tensor_parallel", "degree": 2, "sequence_parallel": True}
COMMON: dict[str, Any] = {
    "train": {"max_steps": 10, "warmup_steps": 2, "lr_decay": "cosine"},
    "task": {"model": {"dim": 32, "heads": 4, "layers": 2, "context": 16, "dropout": 0.1}},
    "checkpoint": {"every_steps": 4},
}


def test_resume_is_exact_at_the_same_mesh(tmp_path: Path) -> None:
    """fully_sharded 2 crashes at step 6, resumes from step 4 and ends bit-identical
    (dropout on: every rank's generators come back too)."""
    text, runs = write_text(tmp_path), tmp_path / "runs"
    full = shoal.train(lm_job(runs, text, strategy=FSDP2, **COMMON, run={"name": "full"}))
    cut = lm_job(runs, text, strategy=FSDP2, **COMMON, run={"name": "cut"})
    cut["faults"] = {"inject": {"rank": 1, "step": 6}}
    with pytest.raises((JobFailed, RuntimeError), match="injected fault at step 6"):
        shoal.train(cut)
    saved = list_checkpoints(runs / "cut" / "checkpoints")[-1]
    assert saved.name == "step-00000004"
    pieces = sorted(p.name for p in (saved / SHARDED_DIR).iterdir())
    assert pieces == [".metadata", "__0_0.distcp", "__1_0.distcp"], "each rank wrote its shard"
    resumed = shoal.train(resume=runs / "cut")
    assert resumed["steps"] == 10
    a, b = final_model(resumed), final_model(full)
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run ends bit-identical"
    assert resumed["valid"] == full["valid"]


def test_resume_under_another_strategy_loads_the_same_parameters(tmp_path: Path) -> None:
    """A tensor_parallel 2 checkpoint resumes under fully_sharded 2 and under local; each
    starts from the saved parameters and optimizer state and trains as the saving run
    would have (local equals tensor_parallel, so all three end alike)."""
    text, runs = write_text(tmp_path), tmp_path / "runs"
    common = {**COMMON, "task": {"model": {"dim": 32, "heads": 4, "layers": 2, "context": 16}}}
    through = shoal.train(lm_job(runs, text, strategy=TP2, **common, run={"name": "tp"}))
    step8 = runs / "tp" / "checkpoints" / "step-00000008"
    saved = plain_model_state(step8, {"sharded": SHARDED_DIR})
    expected = final_model(through)
    for name, table in (
        ("fully_sharded", '{ type = "fully_sharded", degree = 2 }'),
        ("local", '{ type = "local" }'),
    ):
        resumed = shoal.train(resume=step8, overrides=[f"strategy={table}"])
        assert resumed["strategy"] == name and resumed["steps"] == 10
        logs = "".join(p.read_text() for p in (runs / "tp" / "logs").glob("*.log"))
        assert (
            f'resuming with a change of strategy.type: the checkpoint holds "tensor_parallel", asked "{name}"'
            in logs
        )
        a = final_model(resumed)
        for key in a:
            torch.testing.assert_close(a[key], expected[key], rtol=0, atol=2e-5, msg=key)
    assert saved.keys() == final_model(through).keys()


def test_best_checkpoint_exports_a_plain_state_dict(tmp_path: Path) -> None:
    text, runs = write_text(tmp_path), tmp_path / "runs"
    shoal.train(lm_job(runs, text, strategy=FSDP2, run={"name": "fs"}))
    best = list_checkpoints(runs / "fs" / "best")
    assert best, "a best checkpoint"
    out = tmp_path / "model.pt"
    assert export_model(best[-1], out) > 0
    state = torch.load(out, weights_only=True)  # plain tensors, nothing of shoal
    vocab = Tokenizer.load(runs / "fs" / TOKENIZER_FILE).vocab_size
    model = build_lm(LMModelConfig(dim=32, heads=4, layers=2, context=16), vocab)
    model.load_state_dict(state)
