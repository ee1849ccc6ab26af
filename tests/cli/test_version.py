"""`shoal --version`: the installed package's version, pyproject.toml its one source."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest

import shoal
from shoal.cli.main import main
from tests.conftest import REPO, run_shoal


def test_version_is_read_from_the_installed_package(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "9.8.7" if name == "shoal" else real(name)
    )
    cached = vars(shoal).pop("__version__", None)
    try:
        with pytest.raises(SystemExit) as done:
            main(["--version"])
        assert done.value.code == 0
        assert capsys.readouterr().out == "shoal 9.8.7\n"
    finally:
        vars(shoal).pop("__version__", None)
        if cached is not None:
            vars(shoal)["__version__"] = cached


def test_version_is_pyprojects_and_the_changelog_has_it(tmp_path: Path) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    done = run_shoal("--version", cwd=tmp_path)
    assert done.returncode == 0
    assert done.stdout == f"shoal {version}\n"
    assert f"\n## [{version}] - " in (REPO / "CHANGELOG.md").read_text()
