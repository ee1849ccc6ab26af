"""shoal's own plugins: consistent tables, and a config layer that imports no strategy."""

from __future__ import annotations

import subprocess
import sys
import typing

import pytest

from shoal.plugins.kinds import KGE_LOSSES, KGE_MODELS, KINDS, STRATEGIES, TASKS
from shoal.plugins.registry import PluginError


@pytest.mark.parametrize("registry", KINDS, ids=[r.kind.key for r in KINDS])
def test_every_builtin_is_named_by_its_config_tag(registry) -> None:  # type: ignore[no-untyped-def]
    for name, plugin in registry.plugins.items():
        field = plugin.config_class().model_fields[registry.kind.tag]
        assert typing.get_args(field.annotation) == (name,)
        assert plugin.doc(), f"{name}: its config class needs a docstring (shoal plugins shows it)"


@pytest.mark.parametrize(
    "registry",
    [STRATEGIES, TASKS, KGE_MODELS, KGE_LOSSES],
    ids=["strategies", "tasks", "kge_models", "kge_losses"],
)
def test_every_builtin_class_names_its_config(registry) -> None:  # type: ignore[no-untyped-def]
    for plugin in registry.plugins.values():
        assert plugin.load().config_class is plugin.config_class()


def test_unknown_names_list_the_registered_ones() -> None:
    with pytest.raises(PluginError) as caught:
        STRATEGIES.get("zero_bubble")
    assert str(caught.value) == (
        "unknown strategy 'zero_bubble'; registered: local, data_parallel, federated, "
        "population_based, parameter_server, pipeline, tensor_parallel, fully_sharded, hybrid "
        "(`shoal plugins` lists them with where each comes from)"
    )


def test_config_validation_imports_no_strategy_or_torch() -> None:
    """The schema is assembled from config modules alone: no torch, no strategy's run side."""
    code = (
        "import sys; from shoal.config import ShoalConfig; ShoalConfig.model_json_schema(); "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.endswith(('.strategy', "
        "'.task', '.trainer', '.learner'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]"


def test_config_modules_import_no_strategy_or_task() -> None:
    """The lower layer never imports the higher: plugins reach config through the registry."""
    import ast
    from pathlib import Path

    import shoal.config

    offenders = []
    for path in Path(shoal.config.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{path.name}: {n}"
                for n in names
                if n.startswith(("shoal.strategies", "shoal.tasks"))
            ]
    assert offenders == []
