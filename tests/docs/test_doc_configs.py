"""Every TOML block of the docs parses, and every one that is a whole config validates, as
the shipped examples do (tests/test_examples.py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from shoal.config import load_config
from shoal.errors import ConfigError
from tests.conftest import REPO

#: the pages of the site (docs/) and the README
PAGES = [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md"]
_BLOCK = re.compile(r"^```toml\n(.*?)^```", re.DOTALL | re.MULTILINE)
_SNIPPET = re.compile(r'^--8<-- "([^"]+)"$')
#: the sections a config must have (the rest have defaults): a block with them is a whole config
_REQUIRED = {"task", "train"}


def _blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{page.relative_to(REPO)}:{line}", match.group(1)))
    return found


BLOCKS = _blocks()


def test_the_docs_have_configs() -> None:
    assert len(BLOCKS) >= 10
    assert sum(1 for _, text in BLOCKS if _SNIPPET.match(text.strip())) >= 5


def _validate(source: str | Path, where: str, base_dir: Path | None = None) -> None:
    """Validate; only "file not found" for a data file may fail (the reader's own files, or a
    dataset kept beside the repository): any other problem fails the test."""
    try:
        load_config(source if isinstance(source, Path) else tomllib.loads(source), (), base_dir)
    except ConfigError as exc:
        other = [line for line in exc.lines if "file not found" not in line]
        assert not other, f"{where}: " + "\n".join(other)


@pytest.mark.parametrize(("where", "text"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_toml_block_parses_and_a_whole_config_validates(where: str, text: str) -> None:
    snippet = _SNIPPET.match(text.strip())
    if snippet:  # an included file of the repository: a whole config
        path = REPO / snippet.group(1)
        assert path.is_file(), f"{where}: includes {path}, which does not exist"
        _validate(path, where)
        return
    data = tomllib.loads(text)
    if data.keys() >= _REQUIRED:
        _validate(text, where, base_dir=REPO)
