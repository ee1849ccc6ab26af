"""A plugin's config is reported like a built-in's: one line, file:line, field, what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_shoal
from tests.plugins.helpers import LOCAL_SGD, pythonpath, register

GOOD = '[task]\ntype = "classification"\n\n[train]\nepochs = 1\nbatch_size = 32\n\n'
CUSTOM = '[strategy]\ntype = "custom"\nclass = "shoal_local_sgd.strategy:LocalSGDStrategy"\n'

# as their entry point twins, through a process each (2 s): they run with the slow checks
SLOW_CASES = {"dotted path: bad value", "dotted path: unknown key"}
CASES: list[tuple[str, str, list[str], str]] = [
    (
        "entry point: bad value",
        GOOD + '[strategy]\ntype = "local_sgd"\naverage_every = 0\n',
        [],
        "bad.toml:10: strategy.average_every: must be >= 1, got 0",
    ),
    (
        "entry point: unknown key",
        GOOD + '[strategy]\ntype = "local_sgd"\nevery = 2\n',
        [],
        "bad.toml:10: strategy.every: unknown key; allowed here: average_buffers, average_every, "
        "num_replicas, type",
    ),
    (
        "unknown name lists the plugin",
        GOOD + '[strategy]\ntype = "local_sdg"\n',
        [],
        "bad.toml:9: strategy.type: unknown value 'local_sdg'; choose one of: local, "
        "data_parallel, federated, population_based, parameter_server, pipeline, "
        "tensor_parallel, fully_sharded, hybrid, local_sgd",
    ),
    (
        "entry point: rule across sections",
        GOOD.replace("epochs = 1\n", "") + '[strategy]\ntype = "local_sgd"\n',
        [],
        "bad.toml:4: train: set epochs or max_steps (or both: whichever comes first)",
    ),
    (
        "dotted path: bad value",
        GOOD + CUSTOM + "\n[strategy.config]\naverage_every = 0\n",
        [],
        "bad.toml:13: strategy.config.average_every: must be >= 1, got 0",
    ),
    (
        "dotted path: unknown key",
        GOOD + CUSTOM + "\n[strategy.config]\nevery = 2\n",
        [],
        "bad.toml:13: strategy.config.every: unknown key; allowed here: average_buffers, "
        "average_every, num_replicas, type",
    ),
    (
        "dotted path: --set is typed by the plugin's model",
        GOOD + CUSTOM,
        ["--set", "strategy.config.average_every=many"],
        "--set: strategy.config.average_every: must be an integer, got 'many' (string)",
    ),
    (
        "dotted path: no such module",
        GOOD + CUSTOM.replace("shoal_local_sgd.strategy", "shoal_local_sdg.strategy"),
        [],
        "bad.toml:10: strategy.class: shoal_local_sdg.strategy:LocalSGDStrategy: cannot import "
        "it: no module named 'shoal_local_sdg' (put it beside the config, set import_dir, put "
        "its folder on PYTHONPATH or install its package)",
    ),
    (
        "dotted path: not a strategy",
        GOOD + CUSTOM.replace("strategy:LocalSGDStrategy", "config:LocalSGDConfig"),
        [],
        "bad.toml:10: strategy.class: shoal_local_sgd.config:LocalSGDConfig is not a subclass "
        "of shoal.strategies.base.Strategy",
    ),
]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("site")
    register(
        site,
        "shoal-local-sgd",
        {"shoal.strategies": {"local_sgd": "shoal_local_sgd.config:LocalSGDConfig"}},
    )
    return pythonpath(site, LOCAL_SGD)


@pytest.mark.parametrize(
    ("content", "args", "expected"),
    [
        pytest.param(*c[1:], id=c[0], marks=[pytest.mark.slow] if c[0] in SLOW_CASES else [])
        for c in CASES
    ],
)
def test_bad_plugin_config_gives_one_line(
    tmp_path: Path, env: dict[str, str], content: str, args: list[str], expected: str
) -> None:
    (tmp_path / "bad.toml").write_text(content)
    done = run_shoal("config", "validate", "bad.toml", *args, cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [expected]


def test_good_plugin_configs_validate(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "a.toml").write_text(GOOD + '[strategy]\ntype = "local_sgd"\nnum_replicas = 3\n')
    done = run_shoal("config", "validate", "a.toml", cwd=tmp_path, env=env)
    assert (
        done.stdout.strip() == "a.toml: valid (task classification, strategy local_sgd, 3 workers)"
    )
    (tmp_path / "b.toml").write_text(GOOD + CUSTOM + "\n[strategy.config]\nnum_replicas = 3\n")
    done = run_shoal("config", "validate", "b.toml", cwd=tmp_path, env=env)
    assert done.stdout.strip() == "b.toml: valid (task classification, strategy custom, 3 workers)"
