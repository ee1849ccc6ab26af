"""The report page as a reader sees it: panels by name, their charts' drawn paths, rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

#: matplotlib's default colour cycle (C0..C9): data is drawn in these; axes, grid lines,
#: ticks and backgrounds are not
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip


@dataclass
class PanelContent:
    svgs: int = 0
    paths: int = 0  # <path> elements inside SVGs (lines, bars, markers, axes)
    drawn: int = 0  # data inside the axes: lines, bars and markers in the palette's colours
    rows: int = 0  # table body rows
    text: list[str] = field(default_factory=list)


class PageReader(HTMLParser):
    """Collects, per `<section data-panel=...>`, what it draws and says."""

    def __init__(self) -> None:
        super().__init__()
        self.panels: dict[str, PanelContent] = {}
        self._current: PanelContent | None = None
        self._depth = 0
        self._in_body = False
        self._clipped: list[bool] = []  # open <g> elements: clipped to the axes or not
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag in ("script", "link", "img", "iframe"):
            self.links.append(f"{tag} {values}")
        if tag == "section" and "data-panel" in values:
            self._current = self.panels.setdefault(str(values["data-panel"]), PanelContent())
            self._depth = 0
            return
        if self._current is None:
            return
        if tag == "section":
            self._depth += 1
        if tag == "svg":
            self._current.svgs += 1
        if tag == "g":
            self._clipped.append("clip-path" in values)
        if tag in ("path", "use"):
            self._current.paths += tag == "path"
            inside = "clip-path" in values or any(self._clipped)
            style = values.get("style") or ""
            if inside and any(colour in style for colour in PALETTE):
                self._current.drawn += 1
        if tag == "tbody":
            self._in_body = True
        if tag == "tr" and self._in_body:
            self._current.rows += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "g" and self._clipped:
            self._clipped.pop()
        if tag == "tbody":
            self._in_body = False
        if tag == "section" and self._current is not None:
            if self._depth == 0:
                self._current = None
            else:
                self._depth -= 1

    def handle_data(self, data: str) -> None:
        if self._current is not None and data.strip():
            self._current.text.append(data.strip())


def read_page(text: str) -> PageReader:
    reader = PageReader()
    reader.feed(text)
    return reader
