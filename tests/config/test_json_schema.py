"""`shoal config schema` gives every field's default, those a factory builds included."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_shoal


def test_schema_gives_the_defaults_of_tables_and_lists(tmp_path: Path) -> None:
    done = run_shoal("config", "schema", cwd=tmp_path)
    assert done.returncode == 0
    schema = json.loads(done.stdout)
    assert schema["properties"]["strategy"]["default"] == {"type": "local"}
    train = schema["$defs"]["TrainConfig"]["properties"]
    assert train["optimizer"]["default"]["kind"] == "sgd"  # a table chosen among variants
    federated = schema["$defs"]["FederatedStrategyConfig"]["properties"]
    assert federated["inject"]["default"] == []
    assert federated["aggregation"]["default"]["method"] == "fedavg"
    missing = [
        f"{name}.{key}"
        for name, definition in schema["$defs"].items()
        for key, prop in definition["properties"].items()
        if "default" not in prop and key not in definition.get("required", [])
    ]
    assert not missing
