"""Registering plugins in a test without pip: a `*.dist-info` folder on PYTHONPATH.

`importlib.metadata` finds a distribution's entry points through any folder named
`NAME-VERSION.dist-info` on `sys.path` that holds `METADATA` and `entry_points.txt`,
exactly what `pip install` writes; the test's processes see it through PYTHONPATH.
Nothing is installed into the virtual environment.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import REPO

EXAMPLES = REPO / "examples" / "plugins"
LOCAL_SGD = EXAMPLES / "shoal-local-sgd" / "src"
REGRESSION = EXAMPLES / "shoal-regression" / "src"


def register(
    site: Path, distribution: str, entries: dict[str, dict[str, str]], version: str = "0.1.0"
) -> None:
    """Write `distribution`'s metadata into `site`: {group: {name: "module:Class"}}."""
    info = site / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n"
    )
    lines = []
    for group, names in entries.items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in names.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def pythonpath(*folders: Path) -> dict[str, str]:
    """The environment that puts `folders` (and whatever was there) on the import path."""
    parts = [str(f) for f in folders]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return {"PYTHONPATH": os.pathsep.join(parts)}
