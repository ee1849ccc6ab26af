"""`[train] activation_checkpointing` and `compile`: applied to the model's repeated blocks,
each trains as the run without it (losses to 1e-5), names unchanged; refused in one line
where they cannot apply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import shoal
from tests.tasks.module.test_module import (
    FACTORIES,
    losses,
    module_job,
    validates_to_one_line,
)

pytest.importorskip("transformers")


def run(runs: Path, name: str, strategy: dict[str, Any], **train: Any) -> list[float]:
    job = module_job(runs, name, "hf_models:llama", strategy)
    job["train"].update(train)
    return losses(shoal.train(job))


@pytest.mark.parametrize(
    "strategy",
    [{"type": "local"}, {"type": "fully_sharded", "degree": 2}],
    ids=["local", "fully_sharded"],
)
def test_activation_checkpointing_trains_as_without(runs: Path, strategy: dict[str, Any]) -> None:
    plain = run(runs, "plain", strategy)
    checkpointed = run(runs, "checkpointed", strategy, activation_checkpointing=True)
    assert len(plain) == 3
    assert checkpointed == pytest.approx(plain, rel=1e-5)


@pytest.mark.slow  # compiling takes ~20 s on 2 cores
def test_compiled_blocks_train_as_without(runs: Path) -> None:
    plain = run(runs, "plain", {"type": "local"})
    compiled = run(runs, "compiled", {"type": "local"}, compile=True)
    assert compiled == pytest.approx(plain, rel=1e-5)


@pytest.mark.parametrize(
    ("task", "strategy", "expected"),
    [
        (
            f'type = "module"\nfactory = "hf_models:llama"\nimport_dir = "{FACTORIES}"',
            '[strategy]\ntype = "federated"\nnum_clients = 2\nrounds = 1',
            r"train\.activation_checkpointing: strategy 'federated' builds its models in a "
            "loop of its own",
        ),
        (
            'type = "classification"\n[task.data]\nsource = "synthetic"',
            '[strategy]\ntype = "local"',
            r"train\.activation_checkpointing: task type 'classification' has no repeated "
            "blocks",
        ),
    ],
    ids=["federated", "classification"],
)
def test_where_they_cannot_apply_is_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    task: str,
    strategy: str,
    expected: str,
) -> None:
    length = "" if "federated" in strategy else "max_steps = 2\n"  # (rounds decide there)
    text = (
        f"[task]\n{task}\n\n{strategy}\n\n[train]\n{length}batch_size = 8\n"
        "activation_checkpointing = true\n"
    )
    validates_to_one_line(tmp_path, monkeypatch, capsys, text, expected)


@pytest.mark.slow  # compiling takes ~20 s on 2 cores
def test_checkpointed_and_compiled_blocks_train_as_without(runs: Path) -> None:
    """Both at once: the compiled block's backward recomputes its activations (torch's
    composable checkpoint hooks around a compiled block failed there on a stride check)."""
    plain = run(runs, "plain", {"type": "local"})
    both = run(runs, "both", {"type": "local"}, activation_checkpointing=True, compile=True)
    assert both == pytest.approx(plain, rel=1e-5)
