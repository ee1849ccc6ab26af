"""Loading configs: overrides typed by the schema, paths, round trips, help text on every field."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from shoal.config import ShoalConfig, dump_config, load_config
from shoal.config.loading import parse_override
from shoal.config.messages import locate_keys
from shoal.config.schema_walk import union_members
from shoal.config.train import AdamConfig, SGDConfig
from shoal.tasks.classification.config import FileDataConfig, SyntheticDataConfig
from tests.conftest import small_job

BASE = {"task": {"type": "classification"}, "train": {"epochs": 1, "batch_size": 8}}


@pytest.mark.parametrize(
    ("item", "path", "value"),
    [
        ("train.optimizer.lr=0.5", ("train", "optimizer", "lr"), 0.5),
        ("train.epochs=3", ("train", "epochs"), 3),
        ("train.shuffle=false", ("train", "shuffle"), False),
        ("task.model.hidden=[8, 4]", ("task", "model", "hidden"), [8, 4]),
        ("run.name=123", ("run", "name"), "123"),  # a text field keeps the text
        ("run.name=true", ("run", "name"), "true"),
        ("train.lr_decay=cosine", ("train", "lr_decay"), "cosine"),
        (
            'train.optimizer={kind="adam", lr=0.01}',
            ("train", "optimizer"),
            {"kind": "adam", "lr": 0.01},
        ),
    ],
)
def test_override_values_are_typed_by_the_schema(
    item: str, path: tuple[str, ...], value: object
) -> None:
    assert parse_override(item, BASE) == (path, value)


def test_overrides_apply_in_order_and_follow_unions() -> None:
    config = load_config(BASE, ["train.optimizer.kind=adam", "train.optimizer.lr=0.02"])
    assert isinstance(config.train.optimizer, AdamConfig)
    assert config.train.optimizer.lr == 0.02


def test_a_new_variant_tag_replaces_the_old_variants_table() -> None:
    """`--set strategy.type=...` starts the new strategy from its defaults: the old one's
    fields are not unknown keys of the new one; what the same command set there is kept."""
    job = {**BASE, "strategy": {"type": "data_parallel", "num_replicas": 3, "bucket_cap_mb": 1.0}}
    assert load_config(job, ["strategy.type=local"]).strategy.type == "local"
    local = {**BASE, "strategy": {"type": "local"}}
    config = load_config(local, ["strategy.num_replicas=4", "strategy.type=data_parallel"])
    assert config.strategy.type == "data_parallel" and config.strategy.num_replicas == 4
    # the same tag again changes nothing
    config = load_config(job, ["strategy.type=data_parallel"])
    assert config.strategy.num_replicas == 3 and config.strategy.bucket_cap_mb == 1.0
    momentum = {**BASE["train"], "optimizer": {"kind": "sgd", "lr": 0.3, "momentum": 0.9}}
    config = load_config({**BASE, "train": momentum}, ["train.optimizer.kind=adam"])
    assert isinstance(config.train.optimizer, AdamConfig) and config.train.optimizer.lr == 1e-3


def test_omitted_tag_means_the_default_variant() -> None:
    config = load_config({**BASE, "train": {**BASE["train"], "optimizer": {"lr": 0.3}}})
    assert isinstance(config.train.optimizer, SGDConfig) and config.train.optimizer.lr == 0.3
    config = load_config({**BASE, "task": {"type": "classification", "data": {"samples": 64}}})
    assert isinstance(config.task.data, SyntheticDataConfig) and config.task.data.samples == 64


def test_relative_paths_are_taken_from_the_config_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "data.csv").write_text("a,label\n1,0\n")
    (tmp_path / "conf" / "job.toml").write_text(
        '[task]\ntype = "classification"\n[task.data]\nsource = "file"\npath = "data.csv"\n'
        "[train]\nepochs = 1\nbatch_size = 4\n"
    )
    monkeypatch.chdir(tmp_path)  # not the config's folder
    config = load_config("conf/job.toml")
    assert isinstance(config.task.data, FileDataConfig)
    assert config.task.data.path == str((tmp_path / "conf" / "data.csv").resolve())


def test_dump_and_load_round_trip(tmp_path: Path) -> None:
    config = load_config(small_job(tmp_path, strategy={"type": "data_parallel", "num_replicas": 3}))
    saved = tmp_path / "saved.toml"
    saved.write_text(dump_config(config))
    assert load_config(saved) == config


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> None:
    if model in seen:
        return
    seen.add(model)
    for field in model.model_fields.values():
        for member in union_members(field.annotation):
            args = [member, *typing.get_args(member)]
            for arg in args:
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    _models(arg, seen)


def test_every_field_has_help_text() -> None:
    seen: set[type[BaseModel]] = set()
    _models(ShoalConfig, seen)
    assert len(seen) > 10
    missing = [
        f"{model.__name__}.{name}"
        for model in seen
        for name, field in model.model_fields.items()
        if not field.description and name not in ("type", "kind", "source", "method")
    ]
    assert missing == []


def test_json_schema_carries_the_help_text() -> None:
    schema = ShoalConfig.model_json_schema()
    text = json.dumps(schema)
    assert "Global batch size: samples per optimizer step summed over all workers." in text
    assert set(schema["properties"]) == {
        "task",
        "strategy",
        "train",
        "checkpoint",
        "run",
        "monitor",
        "faults",
    }


def test_locate_keys_finds_tables_keys_and_inline_tables() -> None:
    text = '[train]\nepochs = 2\noptimizer = { kind = "adam", lr = 0.1 }\n\n[task.model]\n"hidden" = [1]\n'
    lines = locate_keys(text)
    assert lines[("train",)] == 1
    assert lines[("train", "epochs")] == 2
    assert lines[("train", "optimizer", "lr")] == 3
    assert lines[("task", "model")] == 5
    assert lines[("task", "model", "hidden")] == 6
