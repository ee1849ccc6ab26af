"""What a resume may change lives on the fields (`RESUME_SAFE`, `RESUME_FIXED`): each rule
the resume check applies names a real field of the config it checks, and `shoal config
schema` shows the marks beside each field's help."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from shoal.checkpoint.changes import _models, resume_rules
from shoal.cli.main import main
from shoal.config import load_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONFIGS = sorted(p for p in EXAMPLES.glob("*.toml") if p.name != "multi-host.toml")


def _has_path(models: list[type[BaseModel]], path: list[str]) -> bool:
    """Whether `path` names a field of one of `models` (through their nested models and
    every variant of a union)."""
    if not path:
        return True
    for model in models:
        fields = {info.alias or name: info for name, info in model.model_fields.items()}
        info = fields.get(path[0])
        if info is not None and (len(path) == 1 or _has_path(_models(info.annotation), path[1:])):
            return True
    return False


@pytest.mark.parametrize("config_file", CONFIGS, ids=lambda p: p.name)
def test_every_resume_rule_names_a_real_field(config_file: Path) -> None:
    config = load_config(config_file)
    rules = resume_rules(config)
    patterns = [*rules.safe, *rules.incompatible]
    assert patterns, "the root marks (train.epochs, [checkpoint], ...) are always there"
    for pattern in patterns:
        path = pattern.removesuffix(".*").split(".")
        assert _has_path([type(config)], path), f"{config_file.name}: {pattern} names no field"
    assert "train.epochs" in rules.safe and "strategy.type" in rules.incompatible


def test_the_schema_shows_the_marks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    train = schema["$defs"]["TrainConfig"]["properties"]
    assert train["epochs"]["resume"] == "safe"
    assert "resume" not in train["seed"], "a seed changes the problem: no mark"
    lm_model = schema["$defs"]["LMModelConfig"]["properties"]
    assert lm_model["dim"]["resume"] == "incompatible"
