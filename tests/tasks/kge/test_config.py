"""Bad `[task]` tables of type kge: one line each, with file, line and field path."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from shoal.config import load_config
from shoal.config.loading import dump_config
from shoal.errors import ConfigError

HEAD = '[task]\ntype = "kge"\n'
TRAIN = "\n[train]\nepochs = 1\nbatch_size = 8\n"


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        (
            'dim = 5\nmodel = { type = "complex" }\ndata = { name = "nations" }\n',
            "bad.toml:1: task: dim must be even for complex (dim/2 complex numbers), got 5",
        ),
        (
            'model = { type = "transh" }\ndata = { name = "nations" }\n',
            "bad.toml:3: task.model.type: unknown value 'transh'; choose one of: transe, "
            "distmult, complex, rotate",
        ),
        (
            'model = { type = "transe", p = 3 }\ndata = { name = "nations" }\n',
            "bad.toml:3: task.model.p: must be one of 1 or 2, got 3 (integer)",
        ),
        (
            'model = "distmult"\ndata = { name = "fb15k" }\n',
            "bad.toml:4: task.data.name: must be one of 'nations', 'kinships' or 'umls', "
            "got 'fb15k' (string)",
        ),
        (
            'model = "distmult"\ndata = { train = "missing.tsv" }\n',
            "bad.toml:4: task.data.train: file not found: {dir}/missing.tsv",
        ),
        (
            'model = "distmult"\ndata = { name = "nations" }\nloss = { kind = "hinge" }\n',
            "bad.toml:5: task.loss.kind: unknown value 'hinge'; choose one of: margin_ranking, "
            "logistic, softmax, bce",
        ),
    ],
)
def test_bad_kge_config_is_one_line(tmp_path: Path, task: str, expected: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(HEAD + task + TRAIN)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"{tmp_path}/" + expected.format(dir=tmp_path)


def test_a_model_name_alone_means_its_defaults() -> None:
    config = load_config(
        {
            "task": {"type": "kge", "model": "rotate", "data": {"name": "nations"}},
            "train": TRAIN_DICT,
        }
    )
    assert config.task.model.type == "rotate"  # type: ignore[union-attr]
    assert config.task.loss.kind == "margin_ranking"  # type: ignore[union-attr]


TRAIN_DICT = {"epochs": 1, "batch_size": 8}


@pytest.mark.parametrize(
    "task",
    [
        {"negatives": {"num_negatives_s": 3, "num_negatives_o": 5}, "loss": {"kind": "softmax"}},
        {"negatives": {"num_negatives": 7, "side": "uniform"}},
        {"training": "1vsAll", "loss": {"kind": "softmax"}},
        {"training": {"type": "KvsAll", "label_smoothing": 0.1}, "loss": {"kind": "bce"}},
        {"regularization": {"kind": "n3", "weight": 1e-3}},
        {"regularization": {"kind": "lp", "p": 3, "weight": 1e-3}},
    ],
)
def test_the_resolved_config_a_run_saves_loads_again(task: dict[str, object]) -> None:
    """`shoal train --resume` reads the run's config.toml, written with every default filled
    in: options that exclude each other (one-side vs per-side negatives, negatives under
    1vsAll, p of l2/n3) must not look set there."""
    base = {"type": "kge", "model": "distmult", "data": {"name": "nations"}}
    config = load_config({"task": {**base, **task}, "train": TRAIN_DICT})
    again = load_config(tomllib.loads(dump_config(config)))
    assert again == config
    negatives = again.task.negatives  # type: ignore[union-attr]
    assert negatives.side_counts == config.task.negatives.side_counts  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        (
            'model = "distmult"\ndata = { prepared = "nowhere" }\n',
            "bad.toml:4: task.data.prepared: folder not found: {dir}/nowhere",
        ),
        (
            'model = "distmult"\ndata = { prepared = "." }\n',
            "bad.toml:4: task.data.prepared: {dir}: not a prepared graph (no manifest.json); "
            "prepare it again with: shoal kge prepare",
        ),
        (
            'model = "distmult"\ndata = { name = "nations" }\n'
            "evaluation = { sampled_negatives = 100 }\n",
            'bad.toml:5: task.evaluation: sampled_negatives applies to ranking = "sampled"; '
            "set that or remove it",
        ),
    ],
)
def test_bad_prepared_or_sampled_settings_are_one_line(
    tmp_path: Path, task: str, expected: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(HEAD + task + TRAIN)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"{tmp_path}/" + expected.format(dir=tmp_path)


def test_sampled_ranking_defaults_to_ogb_500_and_the_resolved_config_loads_again() -> None:
    config = load_config(
        {
            "task": {
                "type": "kge",
                "model": "distmult",
                "data": {"name": "nations"},
                "evaluation": {"ranking": "sampled"},
            },
            "train": {"epochs": 1, "batch_size": 8},
        }
    )
    assert config.task.evaluation.sampled_negatives == 500  # type: ignore[union-attr]
    again = load_config(tomllib.loads(dump_config(config)))
    assert again.task == config.task
