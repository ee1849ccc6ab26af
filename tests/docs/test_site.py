"""The documentation site builds with warnings as errors, and every link in it lands."""

from __future__ import annotations

import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.conftest import REPO

for _module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
    pytest.importorskip(_module, reason="the docs extra is not installed: pip install -e '.[docs]'")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once for the module with --strict (a warning fails the build)."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_the_site_builds_strict_with_every_page(site: Path) -> None:
    for page in (
        "index.html",
        "reference/config/index.html",
        "reference/cli/index.html",
        "reference/api/index.html",
        "reference/extend/index.html",
        "operations/run-directory/index.html",
        "explanation/design/index.html",
        "ARCHITECTURE/index.html",
    ):
        assert (site / page).is_file(), page
    # the diagrams are drawn by the vendored mermaid, not one fetched from a CDN
    assert "javascripts/mermaid.min.js" in (site / "index.html").read_text()
    assert (site / "javascripts/mermaid.min.js").stat().st_size > 1_000_000
    api = (site / "reference/api/index.html").read_text()
    assert 'id="shoal.api.train"' in api and "results.json" in api  # from its docstring


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(str(values["id"]))
        if tag == "a" and values.get("href"):
            self.hrefs.append(str(values["href"]))


def _parse(page: Path, cache: dict[Path, _Links]) -> _Links:
    if page not in cache:
        parser = _Links()
        parser.feed(page.read_text(encoding="utf-8"))
        cache[page] = parser
    return cache[page]


def test_every_internal_link_and_anchor_resolves(site: Path) -> None:
    """Read off the built HTML, so the generated pages, the API pages and the navigation are
    checked too, not only the Markdown MkDocs validates."""
    cache: dict[Path, _Links] = {}
    broken = []
    for page in sorted(site.rglob("*.html")):
        for href in _parse(page, cache).hrefs:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or href.startswith("mailto:"):
                continue  # a link out of the site
            path = unquote(parts.path)
            base = site if path.startswith("/") else page.parent  # 404.html: from the root
            target = (base / path.lstrip("/")).resolve() if path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{page.relative_to(site)}: {href} (no such page)")
                continue
            fragment = unquote(parts.fragment)
            if fragment and target.suffix == ".html" and fragment not in _parse(target, cache).ids:
                broken.append(f"{page.relative_to(site)}: {href} (no such anchor)")
    assert not broken, "\n".join(broken[:20])
    assert len(cache) > 20  # the whole site was walked
