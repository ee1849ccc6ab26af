"""The MkDocs hook that adds the generated pages to the site, at every build.

The reference pages are rendered from the code itself (the config schema, the
argument parser, `shoal.extend`'s published names) each time the site is built,
so they cannot fall behind it and nothing generated is committed. The README is
published as `manual.md`, its links rewritten for the site, so that the guides'
pages can point into it until each has its own text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import cli_reference
import config_reference

#: a Markdown link whose target is a path inside the repository (not a URL, not an anchor)
_LINK = re.compile(r"\[([^\]]+)\]\((?!https?://|mailto:|#)([^)\s]+)\)")


def generated_pages(root: Path) -> dict[str, str]:
    """Page path inside the site -> its Markdown, for the repository at `root`."""
    from shoal.cli.main import build_parser
    from shoal.config.json_schema import config_json_schema

    return {
        "reference/config.md": config_reference.render(config_json_schema()),
        "reference/cli.md": cli_reference.render(build_parser()),
        "reference/extend.md": extend_page(),
        "manual.md": manual_page((root / "README.md").read_text(encoding="utf-8")),
    }


def extend_page() -> str:
    """`shoal.extend`: its docstring, then every published name from where it lives."""
    from shoal import extend

    lines = [
        "# Extension API: `shoal.extend`",
        "",
        "::: shoal.extend",
        "    options:",
        "      members: false",
        "      show_root_heading: false",
        "      show_root_toc_entry: false",
    ]
    for target in extend._NAMES.values():  # each published under its own name
        module, _, attribute = target.partition(":")
        lines += [
            "",
            f"::: {module}.{attribute}",
            "    options:",
            "      show_root_heading: true",
            "      heading_level: 2",
        ]
    return "\n".join(lines) + "\n"


def manual_page(readme: str) -> str:
    """The README as a page of the site: links into docs/ point at the site's pages, links
    to other files of the repository become their paths (the site does not hold them)."""

    def link(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if target.startswith("docs/"):
            return f"[{text}]({target.removeprefix('docs/')})"
        if text.strip("`") == target:
            return f"`{target}`"
        return f"{text} (`{target}`)"

    return _LINK.sub(link, readme)


def on_files(files: Any, config: Any) -> Any:
    """MkDocs event: add the generated pages before the navigation is built."""
    from mkdocs.structure.files import File

    root = Path(config.config_file_path).parent
    for path, text in generated_pages(root).items():
        files.append(File.generated(config, path, content=text))
    return files
