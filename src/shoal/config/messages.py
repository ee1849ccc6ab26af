"""Turn pydantic's validation errors into one line each: where, what is wrong, what is allowed.

`examples/x.toml:7: strategy.num_replicas: must be >= 1, got 0`
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from shoal.config.base import FieldError, fields_by_key
from shoal.config.schema_walk import model_at, union_tags

# Every pattern here is linear in the line it scans (a config may hold a 300 KB string
# or a 10 MB key): no two adjacent parts can match the same characters, so a failed
# match never retries a quadratic number of splits.
_HEADER = re.compile(r"^\s*\[\[?([^\]\[]*)\]\]?\s*(#.*)?$")
_KEY = re.compile(
    r"^\s*((?:[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*'))*)\s*="
)
_INLINE_KEY = re.compile(r"[{,]\s*([A-Za-z0-9_-]+)\s*=")  # a key opens a table or follows a comma
#: how much of a value or key a message echoes (the rest is counted, not printed)
ECHO_CHARS = 60
#: a validator's own message longer than this quotes the user's input at length
MESSAGE_CHARS = 600


def _split_key(key: str) -> tuple[str, ...]:
    parts = re.findall(r"\"([^\"]*)\"|'([^']*)'|([A-Za-z0-9_-]+)", key)
    return tuple(next(p for p in groups if p) for groups in parts)


def locate_keys(text: str) -> dict[tuple[str, ...], int]:
    """Map each table and key path of a TOML text to the line that defines it.

    A light scan, not a parser (the text already parsed): headers, `key = value`
    lines and the keys of one-line inline tables. Good enough to point a user at
    the line of a bad value.
    """
    lines: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header and header.group(1).strip():
            table = _split_key(header.group(1).strip())
            lines.setdefault(table, number)
            continue
        key = _KEY.match(line)
        if key:
            path = table + _split_key(key.group(1))
            lines.setdefault(path, number)
            rest = line[key.end() :].lstrip()
            if rest.startswith("{"):
                for inner in _INLINE_KEY.finditer(rest):
                    lines.setdefault((*path, inner.group(1)), number)
    return lines


def shorten(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` as a message echoes it: whole when short, else its start and its length."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def echo(value: Any) -> str:
    """A user's value as a message shows it: its repr, shortened (never a whole 300 KB
    string); an array or table only when it is short and flat (the repr of a deeply
    nested array recurses)."""
    if isinstance(value, str) and len(value) > ECHO_CHARS:
        return f"{value[:ECHO_CHARS]!r}... ({len(value):,} characters)"
    if isinstance(value, list | dict):
        items = value.values() if isinstance(value, dict) else value
        flat = len(value) < 8 and not any(isinstance(v, list | dict) for v in items)
        shown = repr(value) if flat else ""
        return (
            shown
            if shown and len(shown) < 40
            else ("[...]" if isinstance(value, list) else "{...}")
        )
    return shorten(repr(value))


def _describe(value: Any) -> str:
    names = {str: "string", bool: "boolean", int: "integer", float: "float", list: "array"}
    if isinstance(value, dict):
        return "a table"
    kind = names.get(type(value), type(value).__name__)
    return f"{echo(value)} ({kind})"


def _clean_path(loc: Sequence[str | int], data: Any, root: type[BaseModel]) -> list[str | int]:
    """Drop the union tags pydantic puts in locations (strategy.data_parallel.x -> strategy.x)."""
    path: list[str | int] = []
    node = data
    for part in loc:
        if isinstance(node, dict):
            if (
                isinstance(part, str)
                and part not in node
                and (part in node.values() or part in union_tags(root, path, data))
            ):
                continue
            path.append(part)
            node = node.get(part) if isinstance(part, str) else None
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            path.append(part)
            node = node[part]
        else:
            path.append(part)
            node = None
    return path


def dotted(path: Sequence[str | int]) -> str:
    """`a.b[0].c`; a key longer than a message shows is shortened."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{shorten(part)}" if text else shorten(part)
    return text


def _allowed_keys(root: type[BaseModel], table: Sequence[str | int], data: Any) -> list[str]:
    model = model_at(root, table, data)
    return sorted(fields_by_key(model)) if model is not None else []


def _message(error: Any, path: list[str | int], root: type[BaseModel], data: Any) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    if kind == "missing":
        return "required, but missing"
    if kind == "extra_forbidden":
        allowed = _allowed_keys(root, path[:-1], data)
        wrong = str(path[-1])
        close = difflib.get_close_matches(wrong, allowed, n=1) if len(wrong) < 100 else []
        hint = f"did you mean '{close[0]}'? " if close else ""
        return f"unknown key; {hint}allowed here: {', '.join(allowed)}"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        expected = ", ".join(union_tags(root, path[:-1], data))
        if kind == "union_tag_not_found":
            return f"required, but missing; choose one of: {expected}"
        return f"unknown value {echo(ctx.get('tag'))}; choose one of: {expected}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {_describe(value)}"
    bounds = {
        "greater_than_equal": (">=", "ge"),
        "greater_than": (">", "gt"),
        "less_than_equal": ("<=", "le"),
        "less_than": ("<", "lt"),
    }
    if kind in bounds:
        symbol, key = bounds[kind]
        return f"must be {symbol} {ctx.get(key):g}, got {echo(value)}"
    types_ = {
        "int_type": "an integer",
        "int_from_float": "a whole number",
        "float_type": "a number",
        "string_type": "a string",
        "bool_type": "true or false",
        "list_type": "an array",
        "dict_type": "a table",
        "model_type": "a table",
        "model_attributes_type": "a table",
    }
    if kind in types_:
        return f"must be {types_[kind]}, got {_describe(value)}"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')}, got {echo(value)}"
    if kind in ("too_short", "too_long"):
        count = ctx.get("min_length", ctx.get("max_length"))
        got = len(value) if isinstance(value, list) else value
        return f"must have {count} items, got {got}"
    if kind == "value_error":
        return shorten(str(ctx.get("error", error["msg"])), MESSAGE_CHARS)
    return shorten(str(error["msg"]), MESSAGE_CHARS)


def format_errors(
    error: ValidationError,
    data: Any,
    root: type[BaseModel],
    source: str | None = None,
    text: str | None = None,
    overridden: Sequence[tuple[str, ...]] = (),
) -> list[str]:
    """One line per problem: `[file:line: ]path: message`."""
    key_lines = locate_keys(text) if text else {}
    out: list[str] = []
    for item in _expand(error.errors(include_url=False)):
        path = _clean_path(item["loc"], data, root)
        kind = item["type"]
        if kind in ("union_tag_invalid", "union_tag_not_found"):
            discriminator = str((item.get("ctx") or {}).get("discriminator", "type")).strip("'")
            path = [*path, discriminator]
        where = ""
        names = tuple(p for p in path if isinstance(p, str))
        if any(names[: len(o)] == o for o in overridden):
            where = "--set: "
        elif source:
            line = next(
                (key_lines[names[:n]] for n in range(len(names), 0, -1) if names[:n] in key_lines),
                None,
            )
            where = f"{source}:{line}: " if line else f"{source}: "
        out.append(f"{where}{dotted(path) or '(top level)'}: {_message(item, path, root, data)}")
    return out


def _expand(errors: Sequence[Any]) -> list[Any]:
    """Errors raised as `FieldError`s point below where they were raised: move them there.

    A FieldError carrying a nested model's errors (a plugin's own config) becomes
    those errors, each at its own path under the field."""
    out: list[Any] = []
    for item in errors:
        found = (item.get("ctx") or {}).get("error")
        if item["type"] != "value_error" or not isinstance(found, FieldError):
            out.append(item)
            continue
        loc = (*item["loc"], *found.path)
        if not found.errors:
            out.append({**item, "loc": loc, "ctx": {"error": str(found)}})
            continue
        out.extend({**inner, "loc": (*loc, *inner["loc"])} for inner in _expand(found.errors))
    return out
