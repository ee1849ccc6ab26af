"""The README is the front door: short, and every link in it lands on GitHub, where relative
links resolve against the repository (the site is checked by test_site.py)."""

from __future__ import annotations

import re

from tests.conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
#: a Markdown link whose target is a path inside the repository (not a URL, not an anchor)
_LINK = re.compile(r"\[[^\]]+\]\((?!https?://|mailto:|#)([^)\s#]+)(#[^)\s]*)?\)")


def test_readme_is_short() -> None:
    assert len(README.splitlines()) <= 200


def test_every_relative_link_of_the_readme_is_a_file_of_the_repository() -> None:
    targets = [m.group(1) for m in _LINK.finditer(README)]
    assert len(targets) >= 15  # the tables of strategies and tasks link their guides
    missing = [t for t in targets if not (REPO / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_readme_links_a_guide_for_every_strategy_and_task() -> None:
    for name in ("data_parallel", "parameter_server", "federated", "population_based"):
        assert re.search(rf"^\| `{name}` \|.*\]\(docs/", README, re.MULTILINE), name
    for name in ("classification", "module", "kge", "lm"):
        assert re.search(rf"^\| `{name}` \|.*\]\(docs/", README, re.MULTILINE), name
