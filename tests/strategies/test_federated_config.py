"""Bad federated configs: one line each, with file:line, the field and how to fix it."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.cli.main import main

GOOD = '[task]\ntype = "classification"\n\n[train]\nbatch_size = 32\n\n[strategy]\ntype = "federated"\n'

CASES = [
    (
        "epochs",
        GOOD.replace("batch_size = 32\n", "batch_size = 32\nepochs = 3\n"),
        "bad.toml:4: train: under strategy federated the run's length is strategy.rounds (with "
        "strategy.local_epochs or local_steps per round); remove epochs and max_steps",
    ),
    (
        "both local lengths",
        GOOD + "local_epochs = 2\nlocal_steps = 5\n",
        "bad.toml:7: strategy: set local_epochs or local_steps, not both",
    ),
    (
        "more workers than clients",
        GOOD + "num_clients = 3\nworkers = 4\n",
        "bad.toml:7: strategy: workers (4) cannot exceed num_clients (3)",
    ),
    (
        "unknown aggregation",
        GOOD + 'aggregation = { method = "scaffold" }\n',
        "bad.toml:9: strategy.aggregation.method: unknown value 'scaffold'; choose one of: "
        "fedavg, fedprox, fedadagrad, fedadam, fedyogi",
    ),
    (
        "beta2 for fedadagrad",
        GOOD + 'aggregation = { method = "fedadagrad", beta2 = 0.9 }\n',
        "bad.toml:9: strategy.aggregation.beta2: unknown key; did you mean 'beta1'? allowed here: beta1, method, "
        "server_lr, tau",
    ),
    (
        "fraction above 1",
        GOOD + 'client_selection = { method = "random", fraction = 1.5 }\n',
        "bad.toml:9: strategy.client_selection.fraction: must be <= 1, got 1.5",
    ),
    (
        "nobody has the tags",
        GOOD + 'client_selection = { method = "by_capability", required_tags = ["gpu"] }\n',
        "bad.toml:7: strategy: client_selection (by_capability) picks only 0 clients per round "
        "but min_clients = 1: every round would fail",
    ),
    (
        "tag for a missing client",
        GOOD + "num_clients = 4\nclient_tags = { gpu = [1, 9] }\n",
        "bad.toml:7: strategy: client_tags.gpu: client ids [9] are not < num_clients (4)",
    ),
    (
        "round timeout",
        GOOD + "round_timeout_s = 60.0\n\n[faults]\ntimeout_s = 30.0\n",
        "bad.toml:11: faults: timeout_s (30) must exceed strategy.round_timeout_s (60): workers "
        "wait for each other's round in a collective",
    ),
    (
        "negative alpha",
        GOOD + '[strategy.partition]\nkind = "dirichlet"\nalpha = -1.0\n',
        "bad.toml:11: strategy.partition.alpha: must be > 0, got -1.0",
    ),
    (
        "stall without a deadline",
        GOOD + '[[strategy.inject]]\nclient = 0\nround = 0\nkind = "stall"\n',
        "bad.toml:7: strategy: inject: a stall fault needs strategy.round_timeout_s",
    ),
    (
        "dynamic balance under secure aggregation",
        GOOD + 'balance = "dynamic"\nprivacy = { secure_aggregation = true }\n',
        'bad.toml:7: strategy: balance = "dynamic" moves clients between workers, but under '
        "secure aggregation a client's key pair lives on one worker; use balance = "
        '"balanced" (a fixed placement by expected work)',
    ),
]


@pytest.mark.parametrize(("name", "content", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_federated_config_gives_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    name: str,
    content: str,
    expected: str,
) -> None:
    (tmp_path / "bad.toml").write_text(content)
    monkeypatch.chdir(tmp_path)
    assert main(["config", "validate", "bad.toml"]) == 2
    assert capsys.readouterr().err.splitlines() == [expected]


def test_a_good_federated_config_validates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "good.toml").write_text(GOOD + "num_clients = 20\nworkers = 2\n")
    monkeypatch.chdir(tmp_path)
    assert main(["config", "validate", "good.toml", "--set", "strategy.rounds=3"]) == 0
    assert capsys.readouterr().out.strip() == (
        "good.toml: valid (task classification, strategy federated, 2 workers)"
    )
