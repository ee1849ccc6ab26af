"""Every plugin kind is extensible through its entry-point group, and the schema shows it.

Each case registers a small plugin through a `*.dist-info` on PYTHONPATH (see
helpers.py) and runs the real CLI in a fresh process.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_shoal
from tests.plugins.helpers import pythonpath, register

# kind -> (entry-point group, name, implementation module source). The config class lives
# in `plug_<kind>_config.py` (what the entry point names, light to import), the class in
# `plug_<kind>.py`.
KINDS: dict[str, tuple[str, str, str, str]] = {
    "strategies": (
        "shoal.strategies",
        "thing",
        """
        from shoal.strategies.local.strategy import LocalStrategy
        from plug_strategies_config import ThingConfig

        class Thing(LocalStrategy):
            config_class = ThingConfig
        """,
        """
        class ThingConfig(ConfigModel):
            '''A strategy made in a test.'''
            implementation: ClassVar[str] = "plug_strategies:Thing"
            type: Literal["thing"] = "thing"
            knob: int = Field(1, ge=1, description="A knob only this plugin has.")
        """,
    ),
    "tasks": (
        "shoal.tasks",
        "thing",
        """
        from shoal.tasks.classification.task import ClassificationTask
        from plug_tasks_config import ThingConfig

        class Thing(ClassificationTask):
            config_class = ThingConfig
        """,
        """
        class ThingConfig(ConfigModel):
            '''A task made in a test.'''
            implementation: ClassVar[str] = "plug_tasks:Thing"
            type: Literal["thing"] = "thing"
            knob: int = Field(1, ge=1, description="A knob only this plugin has.")
        """,
    ),
    "aggregators": (
        "shoal.aggregators",
        "thing",
        """
        from shoal.comm.aggregators import NativeAllReduce
        from plug_aggregators_config import ThingConfig

        class Thing(NativeAllReduce):
            config_class = ThingConfig
            method = "thing"
        """,
        """
        class ThingConfig(ConfigModel):
            '''An aggregation method made in a test.'''
            implementation: ClassVar[str] = "plug_aggregators:Thing"
            method: Literal["thing"] = "thing"
            knob: int = Field(1, ge=1, description="A knob only this plugin has.")
        """,
    ),
    "compressors": (
        "shoal.compressors",
        "thing",
        """
        from shoal.comm.compression.cast import Float16Cast
        from plug_compressors_config import ThingConfig

        class Thing(Float16Cast):
            config_class = ThingConfig
            kind = "thing"
        """,
        """
        class ThingConfig(ConfigModel):
            '''A compressor made in a test.'''
            implementation: ClassVar[str] = "plug_compressors:Thing"
            kind: Literal["thing"] = "thing"
            knob: int = Field(1, ge=1, description="A knob only this plugin has.")
        """,
    ),
    "kge_models": (
        "shoal.kge_models",
        "thing",
        """
        from shoal.tasks.kge.models import DistMult
        from plug_kge_models_config import ThingConfig

        class Thing(DistMult):
            config_class = ThingConfig
        """,
        """
        from shoal.tasks.kge.model_config import ModelOptions

        class ThingConfig(ModelOptions):
            '''A KG model made in a test.'''
            implementation: ClassVar[str] = "plug_kge_models:Thing"
            type: Literal["thing"] = "thing"
            init_scale: float = 1.0
            knob: int = Field(1, ge=1, description="A knob only this plugin has.")
        """,
    ),
    "kge_losses": (
        "shoal.kge_losses",
        "thing",
        """
        from shoal.tasks.kge.losses import SoftmaxLoss
        from plug_kge_losses_config import ThingConfig

        class Thing(SoftmaxLoss):
            config_class = ThingConfig
        """,
        """
        from shoal.tasks.kge.loss_config import LossOptions

        class ThingConfig(LossOptions):
            '''A KG loss made in a test.'''
            implementation: ClassVar[str] = "plug_kge_losses:Thing"
            kind: Literal["thing"] = "thing"
            knob: int = Field(1, ge=1, description="A knob only this plugin has.")
        """,
    ),
}

HEADER = (
    "from typing import ClassVar, Literal\nfrom pydantic import Field\n"
    "from shoal.config.base import ConfigModel\n"
)


def install(site: Path, kind: str) -> dict[str, str]:
    group, name, implementation, config = KINDS[kind]
    (site / f"plug_{kind}.py").write_text(textwrap.dedent(implementation))
    (site / f"plug_{kind}_config.py").write_text(HEADER + textwrap.dedent(config))
    register(site, f"plug-{kind}", {group: {name: f"plug_{kind}_config:ThingConfig"}})
    return pythonpath(site)


def _mappings(node: Any) -> list[dict[str, str]]:
    """Every discriminator mapping in a JSON schema."""
    found = []
    if isinstance(node, dict):
        mapping = (node.get("discriminator") or {}).get("mapping")
        if isinstance(mapping, dict):
            found.append(mapping)
        for value in node.values():
            found += _mappings(value)
    elif isinstance(node, list):
        for value in node:
            found += _mappings(value)
    return found


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_entry_point_plugin_joins_the_schema(tmp_path: Path, kind: str) -> None:
    env = install(tmp_path, kind)
    done = run_shoal("config", "schema", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    schema = json.loads(done.stdout)
    knob = schema["$defs"]["ThingConfig"]["properties"]["knob"]
    assert knob["description"] == "A knob only this plugin has."
    assert any(m.get("thing") == "#/$defs/ThingConfig" for m in _mappings(schema)), (
        f"no union of the {kind} lists the plugin"
    )


def test_shoal_plugins_lists_every_kind_with_its_origin(tmp_path: Path) -> None:
    envs = [install(tmp_path, kind) for kind in KINDS]
    done = run_shoal("plugins", cwd=tmp_path, env=envs[0])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "  local             One process trains on the whole dataset.  [built-in]" in lines
    for kind, (group, name, _, _) in KINDS.items():
        origin = (
            f"[plug-{kind} 0.1.0, entry point {group}: {name} = plug_{kind}_config:ThingConfig]"
        )
        assert any(line.split()[0] == name and line.endswith(origin) for line in lines if line)


def test_a_name_taken_twice_names_both_origins(tmp_path: Path) -> None:
    (tmp_path / "plug.py").write_text("class Thing: ...\n")
    register(tmp_path, "plug-twice", {"shoal.strategies": {"local": "plug:Thing"}})
    (tmp_path / "job.toml").write_text(
        '[task]\ntype = "classification"\n[train]\nepochs = 1\nbatch_size = 8\n'
    )
    done = run_shoal("config", "validate", "job.toml", cwd=tmp_path, env=pythonpath(tmp_path))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "strategy name 'local' is registered twice: by built-in and by plug-twice 0.1.0, "
        "entry point shoal.strategies: local = plug:Thing; rename the plugin's entry point "
        "(and its config's type) or uninstall one of them"
    ]


@pytest.mark.parametrize(
    ("target", "source", "cause"),
    [
        ("gone.module:ThingConfig", "", "cannot import it: no module named 'gone'"),
        (
            "plug:Missing",
            "class ThingConfig: ...\n",
            "cannot import it: module 'plug' has no attribute 'Missing'",
        ),
        (
            "plug:ThingConfig",
            "class ThingConfig: ...\n",
            "plug:ThingConfig is not a pydantic model; the entry point names the plugin's config "
            "class (a shoal.config.base.ConfigModel)",
        ),
        (
            "plug:ThingConfig",
            "from pydantic import BaseModel\nclass ThingConfig(BaseModel):\n    knob: int = 1\n",
            'its config class ThingConfig needs the field type: Literal["broken"] = "broken" '
            "(no such field)",
        ),
        (
            "plug:ThingConfig",
            "import sys\nsys.exit(3)\n",
            "cannot import it: ImportError: plug called sys.exit(3) while imported",
        ),
    ],
    ids=["no module", "no class", "not a config model", "no type field", "exits at import"],
)
def test_a_broken_plugin_is_one_line(tmp_path: Path, target: str, source: str, cause: str) -> None:
    (tmp_path / "plug.py").write_text(source)
    register(tmp_path, "plug-broken", {"shoal.strategies": {"broken": target}})
    (tmp_path / "job.toml").write_text(
        '[task]\ntype = "classification"\n[train]\nepochs = 1\nbatch_size = 8\n'
    )
    done = run_shoal("config", "validate", "job.toml", cwd=tmp_path, env=pythonpath(tmp_path))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"strategy plugin 'broken' (plug-broken 0.1.0, entry point shoal.strategies: broken = "
        f"{target}): {cause}"
    ]


def test_a_plugin_whose_class_is_broken_fails_when_used(tmp_path: Path) -> None:
    """Only the config is imported to validate other jobs; the class, when a job uses it."""
    (tmp_path / "plug_config.py").write_text(
        HEADER + "class ThingConfig(ConfigModel):\n"
        "    implementation: ClassVar[str] = 'plug_gone:Thing'\n"
        "    type: Literal['thing'] = 'thing'\n"
    )
    register(tmp_path, "plug-half", {"shoal.strategies": {"thing": "plug_config:ThingConfig"}})
    job = '[task]\ntype = "classification"\n[train]\nepochs = 1\nbatch_size = 8\n'
    (tmp_path / "other.toml").write_text(job)
    (tmp_path / "thing.toml").write_text(job + '[strategy]\ntype = "thing"\n')
    env = pythonpath(tmp_path)
    assert run_shoal("config", "validate", "other.toml", cwd=tmp_path, env=env).returncode == 0
    done = run_shoal("config", "validate", "thing.toml", cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "strategy plugin 'thing' (plug-half 0.1.0, entry point shoal.strategies: thing = "
        "plug_config:ThingConfig): cannot import it: no module named 'plug_gone'"
    ]
