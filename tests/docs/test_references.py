"""The generated reference pages hold what their sources hold: every config field with its
type's default and help, every command and option, every name shoal.extend publishes."""

from __future__ import annotations

import json
import re
from typing import Any

import cli_reference
import config_reference
import site_pages

from shoal import extend
from shoal.cli.main import build_parser
from shoal.config.json_schema import config_json_schema

_CELL = re.compile(r"(?<!\\)\|")


def _unescape(text: str) -> str:
    for escaped, plain in (("\\|", "|"), ("\\*", "*"), ("\\_", "_"), ("&lt;", "<")):
        text = text.replace(escaped, plain)
    return text.replace("&gt;", ">").replace("&amp;", "&")


def _sections(page: str) -> list[tuple[str, dict[str, list[str]]]]:
    """(heading, key -> the row's cells) for every heading of a page."""
    sections = []
    for block in re.split(r"^#{1,6} ", page, flags=re.MULTILINE)[1:]:
        heading, _, body = block.partition("\n")
        rows = {}
        for line in body.splitlines():
            if line.startswith("| `"):
                cells = [c.strip() for c in _CELL.split(line)[1:-1]]
                rows[cells[0].strip("`")] = cells
        sections.append((heading, rows))
    return sections


def _default_shown(value: Any) -> str | None:
    """What the default cell must contain for a default of the schema, or None for a table
    whose default is its fields' own."""
    if value is None:
        return "*unset*"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str | int | float):
        return f"`{json.dumps(value)}`"
    if value in ([], {}):
        return f"`{json.dumps(value)}`"
    if isinstance(value, list) and all(isinstance(v, int | float | str) for v in value):
        return "`[" + ", ".join(json.dumps(v) for v in value) + "]`"
    return None


def _holds(
    heading: str,
    rows: dict[str, list[str]],
    tags: dict[str, str],
    expected: dict[str, tuple[str | None, str]],
) -> bool:
    """Whether a section is the table of a definition: its variant in the heading, a row per
    field with the default shown and the help text whole."""
    if any(f'{k} = "{v}"' not in heading for k, v in tags.items()):
        return False
    for key, (default, help_text) in expected.items():
        row = rows.get(key)
        if row is None or len(row) != 5 or _unescape(row[4]) != " ".join(help_text.split()):
            return False
        if default is not None and row[2] != default:
            return False
    return True


def test_config_reference_has_every_field_with_its_default_and_help() -> None:
    schema = config_json_schema()
    sections = _sections(config_reference.render(schema))
    assert len(schema["$defs"]) > 50
    for name, definition in schema["$defs"].items():
        required = set(definition.get("required", []))
        tags = {k: p["const"] for k, p in definition["properties"].items() if "const" in p}
        expected: dict[str, tuple[str | None, str]] = {}
        for key, prop in definition["properties"].items():
            if key in tags:
                continue  # the variant's tag is in its heading
            if key in required:
                expected[key] = ("*required*", prop.get("description", ""))
            else:
                assert "default" in prop, f"{name}.{key}: no default in the schema"
                expected[key] = (_default_shown(prop["default"]), prop.get("description", ""))

        assert any(_holds(h, rows, tags, expected) for h, rows in sections), (
            f"{name} is not on the page whole"
        )


def test_config_reference_sections_and_variants() -> None:
    page = config_reference.render(config_json_schema())
    for section in ("task", "strategy", "train", "checkpoint", "run", "monitor", "faults"):
        assert f"{{#{section}}}" in page
    for strategy in ("local", "data_parallel", "federated", "parameter_server", "hybrid"):
        assert f'`[strategy] type = "{strategy}"` {{#strategy.{strategy}}}' in page
    # a field's default that a factory builds: the variant chosen when the table is left out
    assert re.search(r"^\| `optimizer` \|.*\| `kind = \"sgd\"` \|", page, re.MULTILINE)


def test_cli_reference_has_every_command_and_option() -> None:
    parser = build_parser()
    page = cli_reference.render(parser)
    for name, command, _ in cli_reference._commands(parser, "shoal", ""):
        assert f"## `{name}`" in page
        for action in command._actions:
            for option in action.option_strings:
                assert f"`{option}" in page or f", {option}" in page, f"{name} {option}"
            if action.help and action.help != "==SUPPRESS==":
                assert cli_reference.escape(action.help) in page, f"{name}: {action.help}"
    assert "## `shoal config validate`" in page and "`--allow-changes`" in page


def test_extend_page_documents_every_published_name() -> None:
    page = site_pages.extend_page()
    for target in extend._NAMES.values():
        module, _, attribute = target.partition(":")
        assert f"::: {module}.{attribute}\n" in page
