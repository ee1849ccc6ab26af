"""The MkDocs hook that adds the generated pages to the site, at every build.

The reference pages are rendered from the code itself (the config schema, the
argument parser, `shoal.extend`'s published names) each time the site is built,
so they cannot fall behind it and nothing generated is committed.
"""

from __future__ import annotations

from typing import Any

import cli_reference
import config_reference


def generated_pages() -> dict[str, str]:
    """Page path inside the site -> its Markdown."""
    from shoal.cli.main import build_parser
    from shoal.config.json_schema import config_json_schema

    return {
        "reference/config.md": config_reference.render(config_json_schema()),
        "reference/cli.md": cli_reference.render(build_parser()),
        "reference/extend.md": extend_page(),
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


def on_files(files: Any, config: Any) -> Any:
    """MkDocs event: add the generated pages before the navigation is built."""
    from mkdocs.structure.files import File

    for path, text in generated_pages().items():
        files.append(File.generated(config, path, content=text))
    return files
