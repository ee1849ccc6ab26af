"""Bad `[strategy.aggregation]` and precision settings: one line each, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.cli.main import main

JOB = (
    '[task]\ntype = "classification"\n\n[train]\nepochs = 1\nbatch_size = 32\n\n'
    '[strategy]\ntype = "data_parallel"\nnum_replicas = 3\n\n[strategy.aggregation]\n'
)

CASES = [
    (
        "unknown method",
        JOB + 'method = "butterfly"\n',
        "bad.toml:13: strategy.aggregation.method: unknown value 'butterfly'; choose one of: "
        "native, ring, tree, hierarchical, parameter_server, gossip",
    ),
    (
        "no servers",
        JOB + 'method = "parameter_server"\nnum_servers = 0\n',
        "bad.toml:14: strategy.aggregation.num_servers: must be >= 1, got 0",
    ),
    (
        "branching factor on ring",
        JOB + 'method = "ring"\nbranching_factor = 2\n',
        "bad.toml:14: strategy.aggregation.branching_factor: unknown key; allowed here: "
        "compression, method",
    ),
    (
        "one-way gossip link",
        JOB + 'method = "gossip"\ntopology = [[1, 2], [0], [1]]\n',
        "bad.toml:14: strategy.aggregation.topology: rank 0 lists 2 but rank 2 does not list 0: "
        "gossip links are two-way; add it",
    ),
    (
        "disconnected gossip graph",
        JOB + 'method = "gossip"\ntopology = [[1], [0], []]\n',
        "bad.toml:14: strategy.aggregation.topology: the graph is not connected (ranks [2] "
        "cannot reach rank 0): its ranks would never agree",
    ),
    (
        "unknown topology",
        JOB + 'method = "gossip"\ntopology = "star"\n',
        "bad.toml:14: strategy.aggregation.topology: unknown topology 'star'; choose ring, torus, "
        "exponential or an adjacency list such as [[1, 2], [0, 2], [0, 1]]",
    ),
    (
        "compression with gossip",
        JOB + 'method = "gossip"\ncompression = { kind = "topk" }\n',
        "bad.toml:14: strategy.aggregation.compression: unknown key; allowed here: method, topology",
    ),
    (
        "unknown compression",
        JOB + 'method = "ring"\ncompression = { kind = "int8" }\n',
        "bad.toml:14: strategy.aggregation.compression.kind: unknown value 'int8'; choose one of: "
        "topk, randomk, fp16, bf16, powersgd",
    ),
    (
        "keep nothing",
        JOB + 'compression = { kind = "topk", ratio = 0 }\n',
        "bad.toml:13: strategy.aggregation.compression.ratio: must be > 0, got 0",
    ),
    (
        "dgc with adam",
        JOB.replace("batch_size = 32\n", 'batch_size = 32\noptimizer = { kind = "adam" }\n')
        + 'compression = { kind = "topk", momentum_correction = 0.9 }\n',
        "bad.toml:4: train: strategy.aggregation.compression.momentum_correction applies momentum "
        'before sparsification: use optimizer kind = "sgd" with momentum = 0',
    ),
    (
        "fp16 that would halt",
        JOB.replace("batch_size = 32\n", 'batch_size = 32\nmixed_precision = "fp16"\n'),
        'bad.toml:4: train: mixed_precision = "fp16" overflows now and then by design (the loss '
        'scale then backs off); set on_nonfinite = "skip_step"',
    ),
]


@pytest.mark.parametrize(("content", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_aggregation_config_gives_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    content: str,
    expected: str,
) -> None:
    (tmp_path / "bad.toml").write_text(content)
    monkeypatch.chdir(tmp_path)
    assert main(["config", "validate", "bad.toml"]) == 2
    assert capsys.readouterr().err.splitlines() == [expected]


def test_every_method_validates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for body in (
        'method = "native"\ncompression = { kind = "powersgd", rank = 4 }\n',
        'method = "tree"\ncompression = { kind = "bf16" }\n',
        'method = "hierarchical"\nbranching_factor = 2\n',
        'method = "parameter_server"\nnum_servers = 3\ncompression = { kind = "randomk" }\n',
        'method = "gossip"\ntopology = "exponential"\n',
    ):
        (tmp_path / "good.toml").write_text(JOB + body)
        assert main(["config", "validate", "good.toml"]) == 0, capsys.readouterr().err
