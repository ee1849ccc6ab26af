"""Bad `[strategy] type = "population_based"` configs: one line each, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.cli.main import main

BASE = """[task]
type = "classification"

[train]
max_steps = 10
batch_size = 32
optimizer = {{ kind = "{optimizer}" }}

[strategy]
type = "population_based"
{strategy}
[strategy.search_space]
{space}
"""

CASES = [
    (
        "momentum with adam",
        "adam",
        "",
        'momentum = { kind = "linear", low = 0.1, high = 0.9 }',
        "bad.toml:13: strategy.search_space.momentum: the adam optimizer has no momentum "
        "(train.optimizer.kind); tunable here: beta1, beta2, dropout, lr, weight_decay",
    ),
    (
        "range kind",
        "sgd",
        "",
        'lr = { kind = "exp", low = 0.1, high = 0.9 }',
        "bad.toml:13: strategy.search_space.lr.kind: unknown value 'exp'; "
        "choose one of: log, linear, choice",
    ),
    (
        "log range from zero",
        "sgd",
        "",
        'lr = { kind = "log", low = 0.0, high = 0.9 }',
        "bad.toml:13: strategy.search_space.lr.low: must be > 0, got 0.0",
    ),
    (
        "more workers than members",
        "sgd",
        "population_size = 2\nworkers = 3\n",
        'lr = { kind = "log", low = 0.01, high = 0.9 }',
        "bad.toml:9: strategy: workers (3) exceeds population_size (2): every worker needs "
        "a member; use at most population_size workers",
    ),
    (
        "fraction above one half",
        "sgd",
        'exploit = { method = "truncation", fraction = 0.6 }\n',
        'lr = { kind = "log", low = 0.01, high = 0.9 }',
        "bad.toml:11: strategy.exploit.fraction: must be <= 0.5, got 0.6",
    ),
    (
        "metric without mode",
        "sgd",
        'metric = "f1"\n',
        'lr = { kind = "log", low = 0.01, high = 0.9 }',
        "bad.toml:9: strategy.mode: required with metric = 'f1': set mode = \"max\" if a higher f1 is "
        'better, else mode = "min"',
    ),
    (
        "unknown explore method",
        "sgd",
        'explore = { method = "mutate" }\n',
        'lr = { kind = "log", low = 0.01, high = 0.9 }',
        "bad.toml:11: strategy.explore.method: unknown value 'mutate'; "
        "choose one of: perturbation, resample",
    ),
]


@pytest.mark.parametrize(
    ("optimizer", "strategy", "space", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_bad_population_config_gives_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    optimizer: str,
    strategy: str,
    space: str,
    expected: str,
) -> None:
    (tmp_path / "bad.toml").write_text(
        BASE.format(optimizer=optimizer, strategy=strategy, space=space)
    )
    monkeypatch.chdir(tmp_path)
    assert main(["config", "validate", "bad.toml"]) == 2
    assert capsys.readouterr().err.splitlines() == [expected]


def test_good_population_config_validates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "good.toml").write_text(
        BASE.format(
            optimizer="sgd",
            strategy="workers = 2\n",
            space='lr = { kind = "log", low = 0.01, high = 0.9 }',
        )
    )
    monkeypatch.chdir(tmp_path)
    assert main(["config", "validate", "good.toml"]) == 0
    assert "strategy population_based, 2 workers" in capsys.readouterr().out
