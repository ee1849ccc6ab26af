"""`shoal report` of a hostile run directory: nothing the directory holds runs in the page.

Whoever can write into a run directory (a shared runs/ folder, a run copied from
elsewhere) must not get a script into the browser of whoever opens its report.
Every payload below, if it ran, would change `document.title` or add an element
with id `pwned`; the page is checked by a parser (always) and rendered in headless
Chromium (where it is installed: `apt-get install chromium`), which runs whatever
the page would run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import ClassVar

import pytest

from shoal.report import write_report
from shoal.report.svg import UnsafeSvg, sanitized_svg

RUN = "<img src=x onerror=\"document.title='pwned'\">"  # a run directory's own name
ACT = "document.title='pwned';document.body.appendChild(document.createElement('p')).id='pwned'"
#: population.svg: a valid drawing with every way an SVG runs a script
HOSTILE_SVG = f"""<?xml version="1.0" encoding="utf-8"?>
<!DOCTYPE svg PUBLIC "-//W3C//DTD SVG 1.1//EN" "http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd">
<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"
     xmlns:h="http://www.w3.org/1999/xhtml" width="100pt" height="50pt" viewBox="0 0 100 50"
     onload="{ACT}">
 <script>{ACT}</script>
 <script xlink:href="data:text/javascript,{ACT}"/>
 <style>@import url(http://127.0.0.1:9/x.css); *{{background:u\\72l(http://127.0.0.1:9/y)}}</style>
 <defs><clipPath id="p1"><rect x="0" y="0" width="100" height="50"/></clipPath></defs>
 <g id="axes" clip-path="url(#p1)" onmouseover="{ACT}">
  <path d="M 0 0 L 100 50" style="fill: none; stroke: #1f77b4" onclick="{ACT}"/>
  <rect width="10" height="10" style="fill: url(http://127.0.0.1:9/z)"/>
  <use xlink:href="#p1"/><use href="data:image/svg+xml,&lt;svg onload=&quot;{ACT}&quot;/&gt;"/>
  <text x="1" y="9">score &lt;/svg&gt;&lt;script&gt;{ACT}&lt;/script&gt;</text>
  <a xlink:href="javascript:{ACT}"><text x="1" y="20">click</text></a>
  <set attributeName="onmouseover" to="{ACT}"/>
  <animate attributeName="href" values="javascript:{ACT}"/>
  <foreignObject width="100" height="50"><h:img src="x" onerror="{ACT}"/>
   <h:iframe srcdoc="&lt;script&gt;parent.{ACT}&lt;/script&gt;"/></foreignObject>
  <image href="x" onerror="{ACT}"/>
  <g><!-- --><script>{ACT}</script></g>
 </g>
</svg>
"""


def _hostile_run(root: Path) -> Path:
    """A run directory whose every file a report reads carries a payload."""
    run = root / RUN
    run.mkdir(parents=True)
    script = f"<script>{ACT}</script>"
    (run / "config.toml").write_text(
        f'[strategy]\ntype = "population_based{script}"\n[run]\nname = "</pre>{script}"\n'
    )
    (run / "results.json").write_text(
        json.dumps({"status": f"completed{script}", "steps": 3, "best": {"note": script}})
    )
    records = [
        {"event": "train", "step": 1, "loss": 1.0, "time": 1.0, f"lr{script}": 0.1},
        {"event": "train", "step": 2, "loss": 0.5, "time": 2.0, f"lr{script}": 0.1},
        {"event": "eval", "step": 2, "split": f"val{script}", "loss": 0.4, "acc$\\frac{$": 0.5},
        {"event": "eval", "step": 3, "split": f"val{script}", "loss": 0.3, "acc$\\frac{$": 0.6},
        {"event": "member", "generation": 1, "member": script, "score": 0.4,
         "hyperparameters": {script: 0.1}, "parent": script, "status": script},
        {"event": "exploit", "generation": script, "member": 1, "parent": 0,
         "hyperparameters": {"lr": script}},
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "population.svg").write_text(HOSTILE_SVG)
    return run


class _Active(HTMLParser):
    """What in a page could run or fetch: script-like elements, handlers, links out."""

    RUNS: ClassVar = {"script", "iframe", "object", "embed", "foreignobject", "img", "image", "a", "set",
            "animate", "link", "meta", "base", "style"}  # fmt: skip

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.RUNS - {"meta", "style"}:  # the page's and the charts' own
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            text = (value or "").lower()
            if name.startswith("on") or "javascript:" in text or "data:" in text:
                self.found.append(f"<{tag} {name}={value!r}>")
            if "url(" in text and not text.replace(" ", "").startswith("url(#"):
                self.found.append(f"<{tag} {name}={value!r}>")
            if name.endswith("href") and not text.startswith("#"):
                self.found.append(f"<{tag} {name}={value!r}>")


@pytest.fixture
def hostile_page(tmp_path: Path) -> Path:
    return write_report([_hostile_run(tmp_path / "runs")], tmp_path / "report.html")


def test_a_hostile_run_directory_puts_nothing_active_into_the_page(hostile_page: Path) -> None:
    page = hostile_page.read_text(encoding="utf-8")
    active = _Active()
    active.feed(page)
    assert active.found == [], active.found
    assert "127.0.0.1:9" not in page and "@import" not in page, "nothing fetched"
    assert "clip-path" in page and "stroke: #1f77b4" in page, "the drawing itself is kept"
    assert "score &lt;/svg&gt;&lt;script&gt;" in page, "its text is kept, escaped"


def test_an_svg_that_cannot_be_made_safe_is_left_out_with_the_reason() -> None:
    for text, reason in (
        ("<svg", "not XML"),
        ('<!DOCTYPE x [<!ENTITY a "b">]><svg xmlns="http://www.w3.org/2000/svg"/>', "entities"),
        ("<html><svg/></html>", "not <svg>"),
    ):
        with pytest.raises(UnsafeSvg, match=reason):
            sanitized_svg(text)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(
    _chromium() is None, reason="chromium is not installed (apt-get install chromium)"
)
def test_headless_chromium_runs_nothing_from_a_hostile_run_directory(
    hostile_page: Path, tmp_path: Path
) -> None:
    """The page as a browser runs it: load events fired, timers given time, then the DOM."""
    browser = _chromium()
    assert browser is not None
    done = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=3000",
            "--dump-dom",
            hostile_page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert "<title>shoal report: " in dom, dom[:500]
    assert "pwned</title>" not in dom and 'id="pwned"' not in dom
    assert "<svg" in dom and "Population" in dom


def test_files_that_are_not_utf8_give_a_report_not_a_traceback(tmp_path: Path) -> None:
    """A metrics.jsonl with a line of Latin-1 and a config.toml of binary: the readable
    records are drawn, the config is shown as far as it is text."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_bytes(b'[strategy]\ntype = "local"\n# \xff\xfe caf\xe9\n')
    good = [{"event": "train", "step": s, "loss": 1.0 / s, "time": float(s)} for s in (1, 2, 3)]
    lines = [json.dumps(r).encode() + b"\n" for r in good]
    lines.insert(1, b'{"event": "train", "step": 9, "note": "caf\xe9"}\n')
    (run / "metrics.jsonl").write_bytes(b"".join(lines))
    page = write_report([run], tmp_path / "report.html").read_text(encoding="utf-8")
    assert 'data-panel="loss"' in page
    assert "caf\ufffd" in page and "type = &quot;local&quot;" in page
