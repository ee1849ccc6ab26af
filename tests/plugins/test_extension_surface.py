"""The published extension surface: the example plugins need nothing else from shoal, every
name it publishes imports, and importing it costs no torch (a plugin's config module takes
its base class from it)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import shoal.extend

PLUGINS = Path(__file__).resolve().parents[2] / "examples" / "plugins"


def _shoal_imports(path: Path) -> list[str]:
    """The shoal modules a file imports (`from shoal.x import ...`, `import shoal.x`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] == "shoal"
        ):
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "shoal"]
    return found


@pytest.mark.parametrize(
    "path", sorted(PLUGINS.rglob("*.py")), ids=lambda p: str(p.relative_to(PLUGINS))
)
def test_an_example_plugin_imports_only_the_extension_surface(path: Path) -> None:
    assert {module for module in _shoal_imports(path)} <= {"shoal.extend"}


def test_every_published_name_imports() -> None:
    for name in shoal.extend.__all__:
        assert getattr(shoal.extend, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = shoal.extend.Nope  # type: ignore[attr-defined]


def test_a_config_base_from_the_surface_imports_no_torch() -> None:
    probe = "import sys; from shoal.extend import StrategySection, TaskSection; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
