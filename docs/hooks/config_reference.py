"""The configuration reference page, rendered from the JSON Schema of configs.

The schema is the one `shoal config schema` prints: the help text lives on the
config fields once, and this page is only another view of it. Every table of a
config gets a heading with a stable anchor (its TOML path, a variant's name after
the key that chooses it: `strategy.data_parallel.aggregation.ring`), and a table of
its fields: key, type, default, what a resume may do with it, help.

The schema is walked as plain JSON (no pydantic), so the page follows whatever the
schema says, plugins' sections included.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

#: the keys a union of tables is chosen by (pydantic's discriminators in shoal's configs)
_NULL = {"type": "null"}
_RESUME = {
    "safe": "free",
    "incompatible": "never",
    None: "`--allow-changes`",
}
_OR = " \\| "  # an escaped pipe: these cells sit in Markdown tables
_CODE = re.compile(r"(`[^`]*`)")


@dataclass
class Table:
    """One TOML table of the config: where it is, what chooses it, its fields."""

    path: str  # TOML path, e.g. "strategy.aggregation"
    anchor: str  # e.g. "strategy.data_parallel.aggregation.ring"
    definition: dict[str, Any]
    chosen_by: tuple[str, str] | None = None  # ("method", "ring")
    array: bool = False  # [[path]]: a list of tables
    resume: str | None = None  # the mark it inherits
    same_as: str | None = None  # the anchor where the same table is already described
    children: list[Table] = field(default_factory=list)


def render(schema: dict[str, Any]) -> str:
    """The whole reference page (Markdown) for a config JSON Schema."""
    walker = _Walker(schema)
    lines = [
        "# Configuration reference",
        "",
        "Every section and field of a config, generated from the JSON Schema that",
        "`shoal config schema` prints (the help text lives on the fields, once). A table",
        "chosen among variants (by `type`, `kind`, `source` or `method`) has one heading",
        "per variant.",
        "",
        "- **default**: *required* must be written; *unset* means the key is left out",
        "  (TOML has no null); a table's default names the variant chosen when it is",
        "  left out.",
        "- **resume**: what `shoal train --resume` allows when the value differs from the",
        "  checkpoint's: *free*, *never* (the saved state cannot load), or only with",
        "  `--allow-changes` (it changes what the run trains; logged in `metrics.jsonl`).",
        "",
        "## Sections",
        "",
    ]
    root = Table(path="", anchor="", definition=schema)
    lines += _field_table(walker, root)
    for key, prop in schema.get("properties", {}).items():
        tables = list(walker.tables(key, key, prop, _mark(prop, None)))
        if len(tables) == 1 and tables[0].chosen_by is None:
            lines += _render_table(walker, tables[0], level=2)
            continue
        lines += ["", f"## `[{key}]` {{#{key}}}", ""]
        lines += _paragraph(prop.get("description", ""))
        for table in tables:
            lines += _render_table(walker, table, level=3)
    return "\n".join(lines).rstrip() + "\n"


class _Walker:
    """Follows `$ref`s, optional values and discriminated unions of one schema."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.defs: dict[str, Any] = schema.get("$defs", {})
        #: (TOML path, definition, resume mark) -> the anchor it is described at: the same
        #: table under several variants (a KG model's init, a method's compression) once
        self.described: dict[tuple[str, str, str | None], str] = {}

    def table(
        self, path: str, anchor: str, ref: str, chosen_by: tuple[str, str] | None, **kw: Any
    ) -> Table:
        definition = self.resolve({"$ref": ref}) if ref else {}
        key = (path, ref, kw.get("resume"))
        first = self.described.setdefault(key, anchor) if ref else anchor
        same_as = first if first != anchor else None
        return Table(path, anchor, definition, chosen_by, same_as=same_as, **kw)

    def resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        if ref is None:
            return node
        resolved: dict[str, Any] = self.defs[ref.rsplit("/", 1)[-1]]
        return resolved

    def tables(
        self, path: str, anchor: str, prop: dict[str, Any], resume: str | None
    ) -> Iterator[Table]:
        """The tables a field's value may be, one per variant of a union."""
        node, _ = _optional(prop)
        array = False
        if node.get("type") == "array" and isinstance(node.get("items"), dict):
            node, array = node["items"], True
        elif isinstance(node.get("additionalProperties"), dict):  # name -> table
            node, path, anchor = node["additionalProperties"], f"{path}.NAME", f"{anchor}.NAME"
        union = _union(node)
        if union is not None:
            tag, refs = union
            for value, ref in refs.items():
                yield self.table(
                    path, f"{anchor}.{value}", ref, (tag, value), array=array, resume=resume
                )
            return
        if "properties" in self.resolve(node):
            ref = node.get("$ref", "")
            if ref:
                yield self.table(path, anchor, ref, None, array=array, resume=resume)
            else:
                yield Table(path, anchor, node, None, array, resume)


def _optional(prop: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the value's schema without its `null` alternative, whether it may be unset)."""
    options = prop.get("anyOf")
    if options and _NULL in options:
        rest = [o for o in options if o != _NULL]
        if len(rest) == 1:
            return rest[0], True
        return {"anyOf": rest}, True
    return prop, False


def _union(node: dict[str, Any]) -> tuple[str, dict[str, str]] | None:
    """(the tag key, tag value -> $ref) of a discriminated union of tables, or None."""
    discriminator = node.get("discriminator")
    if not discriminator or "oneOf" not in node:
        return None
    order = [o["$ref"] for o in node["oneOf"]]  # declaration order, not the mapping's
    mapping: dict[str, str] = discriminator["mapping"]
    by_ref = {ref: value for value, ref in mapping.items()}
    return discriminator["propertyName"], {by_ref[ref]: ref for ref in order}


def _mark(prop: dict[str, Any], inherited: str | None) -> str | None:
    """The resume mark a field carries: an incompatible mark anywhere above wins (as
    checkpoint/changes.py classifies); an incompatible union marks its variant only."""
    own = prop.get("resume")
    if inherited == "incompatible" or own is None:
        return inherited
    if own == "incompatible" and _union(_optional(prop)[0]) is not None:
        return inherited  # the variant's tag only: see the table's heading
    return str(own)


def _heading(table: Table) -> str:
    name = f"[[{table.path}]]" if table.array else f"[{table.path}]"
    chooser = f' {table.chosen_by[0]} = "{table.chosen_by[1]}"' if table.chosen_by else ""
    return f"`{name}{chooser}` {{#{table.anchor}}}"


def _render_table(walker: _Walker, table: Table, level: int) -> list[str]:
    lines = ["", f"{'#' * min(level, 6)} {_heading(table)}", ""]
    lines += _paragraph(table.definition.get("description", ""))
    lines += ["", *_field_table(walker, table)]
    for child in table.children:
        lines += _render_table(walker, child, level + 1)
    return lines


def _field_table(walker: _Walker, table: Table) -> list[str]:
    """The table of a config table's fields; collects its nested tables as children."""
    definition = table.definition
    required = set(definition.get("required", []))
    rows = ["| key | type | default | resume | description |", "|---|---|---|---|---|"]
    for key, prop in definition.get("properties", {}).items():
        if table.chosen_by and key == table.chosen_by[0]:
            continue  # in the heading
        path = f"{table.path}.{key}" if table.path else key
        anchor = f"{table.anchor}.{key}" if table.anchor else key
        resume = _mark(prop, table.resume)
        nested = list(walker.tables(path, anchor, prop, resume))
        if table.path:  # the root's sections get sections of their own
            table.children.extend(t for t in nested if t.same_as is None)
        kind = _type(walker, prop, nested)
        default = "*required*" if key in required else _default(walker, prop)
        resume_text = _RESUME.get(resume, resume or "")
        if prop.get("resume") == "incompatible" and nested and nested[0].chosen_by:
            resume_text = f"{nested[0].chosen_by[0]}: never"
        help_text = " ".join(escape(prop.get("description", "")).split())
        rows.append(f"| `{key}` | {kind} | {default} | {resume_text} | {help_text} |")
    return rows


def _type(walker: _Walker, prop: dict[str, Any], nested: list[Table]) -> str:
    node, optional = _optional(prop)
    if nested:
        links = [f"[{t.chosen_by[1]}](#{t.same_as or t.anchor})" for t in nested if t.chosen_by]
        container = "list of tables" if nested[0].array else "table"
        if "additionalProperties" in node:
            container = "tables by name"
        tag = nested[0].chosen_by[0] if nested[0].chosen_by else ""
        text = (
            f"{container}: `{tag}` = {_OR.join(links)}"
            if links
            else f"[{container}](#{nested[0].same_as or nested[0].anchor})"
        )
    else:
        text = _value_type(node)
    return f"{text}, optional" if optional else text


def _value_type(node: dict[str, Any]) -> str:
    if "const" in node:
        return f'`"{node["const"]}"`'
    if "enum" in node:
        return _OR.join(f"`{json.dumps(v)}`" for v in node["enum"])
    if "anyOf" in node:
        return " or ".join(_value_type(o) for o in node["anyOf"])
    kind = node.get("type")
    if kind == "array":
        items = node.get("items")
        text = f"list of {_value_type(items)}" if isinstance(items, dict) else "list"
        low, high = node.get("minItems"), node.get("maxItems")
        if low is not None and low == high:
            text += f" ({low} items)"
        elif low:
            text += f" (at least {low})"
        return text
    if kind == "object":
        values = node.get("additionalProperties")
        if isinstance(values, dict):
            return f"table of name → {_value_type(values)}"
        return "table"
    if kind is None:
        return "table"
    name = {"integer": "int", "number": "float", "boolean": "bool", "string": "string"}[kind]
    return name + _bounds(node)


def _bounds(node: dict[str, Any]) -> str:
    low = ("[", node["minimum"]) if "minimum" in node else None
    low = ("(", node["exclusiveMinimum"]) if "exclusiveMinimum" in node else low
    high = ("]", node["maximum"]) if "maximum" in node else None
    high = (")", node["exclusiveMaximum"]) if "exclusiveMaximum" in node else high
    if low and high:
        return f" in {low[0]}{low[1]}, {high[1]}{high[0]}"
    if low:
        return f" {'≥' if low[0] == '[' else '>'} {low[1]}"
    if high:
        return f" {'≤' if high[0] == ']' else '<'} {high[1]}"
    return ""


def _default(walker: _Walker, prop: dict[str, Any]) -> str:
    if "default" not in prop:
        return ""
    value = prop["default"]
    if value is None:
        return "*unset*"
    if isinstance(value, dict) and value:
        union = _union(_optional(prop)[0])
        if union is not None and union[0] in value:
            return f'`{union[0]} = "{value[union[0]]}"`'
        return "*its fields' defaults*"
    return f"`{_toml(value)}`"


def _toml(value: Any) -> str:
    """A default as it would be written in TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def escape(text: str) -> str:
    """Help text made safe for a Markdown table cell; code spans kept as written."""
    parts = _CODE.split(text)
    for i, part in enumerate(parts):
        if i % 2 == 0:
            part = part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            part = part.replace("*", "\\*").replace("_", "\\_")
        parts[i] = part.replace("|", "\\|")
    return "".join(parts)


def _paragraph(text: str) -> list[str]:
    return escape(text).splitlines() if text else []
