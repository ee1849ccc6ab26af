"""Bad pipeline configs: one line each, with file:line, the field and how to fix it."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.cli.main import main
from tests.tasks.lm.helpers import write_text

GOOD = (
    '[task]\ntype = "lm"\ndata = { train = "text.txt" }\n'
    "model = { dim = 32, heads = 4, layers = 4, context = 16 }\n\n"
    "[train]\nbatch_size = 8\nmax_steps = 4\ndrop_last = true\n\n"
    '[strategy]\ntype = "pipeline"\nstages = 2\nmicrobatches = 4\n'
)

CASES = [
    (
        "more stages than blocks",
        GOOD.replace("stages = 2", "stages = 5"),
        "bad.toml:13: strategy.stages: 5 stages need at least as many blocks; the model has 4 "
        "(task.model.layers): use fewer stages or more layers",
    ),
    (
        "interleaved stages beyond the blocks",
        GOOD + 'schedule = "interleaved_1f1b"\nvirtual_stages = 3\n',
        "bad.toml:13: strategy.stages: 6 stages (2 ranks x 3 virtual stages) need at least as "
        "many blocks; the model has 4 (task.model.layers): use fewer stages or more layers",
    ),
    (
        "a gap",
        GOOD + "partitions = [[0, 1], [3, 3]]\n",
        "bad.toml:15: strategy.partitions: stage 1 starts at block 3 and leaves a gap before it "
        "(expected block 2): the stages must cover the blocks in order, each once",
    ),
    (
        "an overlap",
        GOOD + "partitions = [[0, 2], [2, 3]]\n",
        "bad.toml:15: strategy.partitions: stage 1 starts at block 2 and overlaps the stage "
        "before (expected block 3): the stages must cover the blocks in order, each once",
    ),
    (
        "blocks left out",
        GOOD + "partitions = [[0, 1], [2, 2]]\n",
        "bad.toml:15: strategy.partitions: the stages cover blocks 0..2, the model has 4 (0..3): "
        "every block must belong to one stage",
    ),
    (
        "one partition per stage",
        GOOD + "partitions = [[0, 3]]\n",
        "bad.toml:15: strategy.partitions: 1 partitions for 2 stages: give one [first, last] "
        "block range per stage",
    ),
    (
        "micro-batches that do not divide the batch",
        GOOD.replace("microbatches = 4", "microbatches = 3"),
        "bad.toml:14: strategy.microbatches: 3 micro-batches do not divide train.batch_size (8): "
        "choose a divisor of it",
    ),
    (
        "virtual stages without interleaving",
        GOOD + "virtual_stages = 2\n",
        "bad.toml:15: strategy.virtual_stages: schedule 1f1b runs one stage per rank; unset "
        'virtual_stages, or set schedule = "interleaved_1f1b"',
    ),
    (
        "train.micro_batches as well",
        GOOD.replace("max_steps = 4", "max_steps = 4\nmicro_batches = 2"),
        "bad.toml:9: train.micro_batches: strategy pipeline cuts each batch into "
        "strategy.microbatches itself; set train.micro_batches = 1",
    ),
    (
        "an unknown schedule",
        GOOD + 'schedule = "zero_bubble"\n',
        "bad.toml:15: strategy.schedule: must be one of 'gpipe', '1f1b' or 'interleaved_1f1b', "
        "got 'zero_bubble' (string)",
    ),
    (
        "re-balancing a memory balance",
        GOOD + 'balance = "memory"\nrebalance = "checkpoint"\n',
        "bad.toml:16: strategy.rebalance: rebalance re-partitions by measured time, balance = "
        'memory by memory; set balance = "time", or rebalance = "off"',
    ),
    (
        "re-balancing without periodic checkpoints",
        GOOD + 'rebalance = "checkpoint"\n\n[checkpoint]\nevery_epochs = 0\n',
        "bad.toml:15: strategy.rebalance: rebalance = checkpoint re-partitions at periodic "
        "checkpoints and none is written; set checkpoint.every_steps (or every_epochs), or "
        'rebalance = "off"',
    ),
    (
        "a threshold of 1 or more",
        GOOD + 'rebalance = "checkpoint"\nrebalance_threshold = 1.5\n',
        "bad.toml:16: strategy.rebalance_threshold: must be < 1, got 1.5",
    ),
]


@pytest.mark.parametrize(("name", "content", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_pipeline_config_gives_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    name: str,
    content: str,
    expected: str,
) -> None:
    write_text(tmp_path)
    (tmp_path / "bad.toml").write_text(content)
    monkeypatch.chdir(tmp_path)
    assert main(["config", "validate", "bad.toml"]) == 2
    assert capsys.readouterr().err.splitlines() == [expected]


def test_a_good_pipeline_config_validates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_text(tmp_path)
    (tmp_path / "good.toml").write_text(GOOD + "partitions = [[0, 0], [1, 3]]\n")
    monkeypatch.chdir(tmp_path)
    assert main(["config", "validate", "good.toml"]) == 0
    assert capsys.readouterr().out.strip() == (
        "good.toml: valid (task lm, strategy pipeline, 2 workers)"
    )
