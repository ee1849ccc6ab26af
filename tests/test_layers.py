"""The layering the architecture promises, checked on the import statements themselves.

- No strategy imports from `tasks/` (strategies ask a task for capabilities, never for
  its name or its internals), and no task imports a strategy.
- The launcher, recovery, the CLI and the planner import no strategy implementation:
  they ask the job's shape, computed by the strategy's config section.
- The job's shape, the config and the capability declarations import no torch, so a
  config validates (and a launcher plans) without it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "shoal"


def _imports(folder: Path) -> dict[str, set[str]]:
    """Every shoal module each file under `folder` imports."""
    found: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")) if folder.is_dir() else [folder]:
        modules = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules.add(node.module)
            elif isinstance(node, ast.Import):
                modules.update(alias.name for alias in node.names)
        found[str(path.relative_to(SRC))] = {m for m in modules if m.startswith("shoal.")}
    return found


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("strategies", "shoal.tasks"),
        ("tasks", "shoal.strategies"),
        ("launch", "shoal.strategies"),
        ("recovery", "shoal.strategies"),
        ("cli", "shoal.strategies"),
        ("api.py", "shoal.strategies"),
        ("shape", "shoal.strategies"),
        ("training", "shoal.strategies"),
    ],
)
def test_no_import_crosses_a_forbidden_line(folder: str, forbidden: str) -> None:
    crossing = {
        path: sorted(m for m in modules if m == forbidden or m.startswith(forbidden + "."))
        for path, modules in _imports(SRC / folder).items()
    }
    assert {path: ms for path, ms in crossing.items() if ms} == {}


@pytest.mark.parametrize(
    "module",
    ["shoal.shape.sizing", "shoal.config", "shoal.protocols.capabilities", "shoal.extend"],
)
def test_the_shape_and_the_config_import_no_torch(module: str) -> None:
    probe = f"import sys, {module}; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize(
    "module",
    [
        "shoal.launch.worker",
        "shoal.strategies.local",
        "shoal.strategies.data_parallel.strategy",
        "shoal.strategies.parameter_server.strategy",
        "shoal.tasks.kge.task",
    ],
)
def test_what_lays_no_model_out_imports_no_dtensor(module: str) -> None:
    """torch.distributed.tensor brings DTensor's operator tables, torch.fx and sympy (about
    40 MiB of every process's memory and 0.7 s): only the strategies that lay a model out
    create DTensors, and the rest tell them apart without it (runtime/dtensors.py)."""
    probe = f"import sys, {module}; print('torch.distributed.tensor' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
