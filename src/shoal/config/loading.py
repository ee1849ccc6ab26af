"""Read a TOML config, apply `--set` overrides, validate, and save the resolved result."""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import ValidationError

from shoal.config.messages import format_errors
from shoal.config.root import ShoalConfig
from shoal.config.schema_walk import annotation_at, is_text
from shoal.errors import ConfigError

ConfigSource = str | Path | Mapping[str, Any] | ShoalConfig
NESTED_TOO_DEEP = (
    "arrays or tables nested too deeply to read (a config needs a few levels; look for a "
    "run of '[' or '{')"
)


def read_toml(path: Path) -> tuple[dict[str, Any], str]:
    """Parse a TOML file; every failure is a one-line ConfigError naming file and line."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (bad byte at offset {exc.start}); a config is a TOML text file"
        ) from None
    text = text.removeprefix("\ufeff")  # a byte-order mark (Notepad's UTF-8) is not TOML
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = re.search(r"\(at line (\d+), column (\d+)\)", message)
        if found:
            detail = message[: found.start()].strip()
            raise ConfigError(
                f"{path}:{found.group(1)}: invalid TOML: {detail} (column {found.group(2)})"
            ) from None
        raise ConfigError(f"{path}: invalid TOML: {message}") from None
    except RecursionError:  # tomllib recurses once per level of nesting
        raise ConfigError(f"{path}: invalid TOML: {NESTED_TOO_DEEP}") from None
    return data, text


def parse_override(item: str, data: Mapping[str, Any]) -> tuple[tuple[str, ...], Any]:
    """`a.b=value` -> (("a", "b"), typed value), typed by the schema at that path.

    Text fields keep the raw string (`--set run.name=123` is the name "123");
    anything else is read as a TOML value (`0.1`, `true`, `[64, 64]`, `{kind="adam"}`).
    """
    key, sep, raw = item.partition("=")
    path = tuple(part.strip() for part in key.split("."))
    if not sep or not all(path):
        raise ConfigError(
            f"--set {item!r}: expected KEY=VALUE with a dotted key, "
            "e.g. --set train.optimizer.lr=0.1"
        )
    raw = raw.strip()
    if is_text(annotation_at(ShoalConfig, path, data)):
        return path, raw
    try:
        return path, tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return path, raw  # not a TOML value: validation says what type was expected
    except RecursionError:
        raise ConfigError(f"--set {key.strip()}: {NESTED_TOO_DEEP}") from None


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> list[tuple[str, ...]]:
    """Apply `--set` items in order onto `data`; returns the paths they set."""
    paths = []
    for item in overrides:
        path, value = parse_override(item, data)
        node = data
        for key in path[:-1]:
            child = node.get(key)
            if not isinstance(child, dict):
                child = {}
                node[key] = child
            node = child
        node[path[-1]] = value
        paths.append(path)
    return paths


def load_config(
    source: ConfigSource,
    overrides: Sequence[str] = (),
    base_dir: Path | None = None,
) -> ShoalConfig:
    """Load and validate a config from a TOML path, a dict or a ShoalConfig.

    Relative file paths inside the config are taken from the config file's folder
    (or `base_dir` for a dict). Raises ConfigError with one line per problem.
    """
    if isinstance(source, ShoalConfig):
        if not overrides:
            return source
        source = source.model_dump(mode="json", exclude_none=True)
    text: str | None = None
    label: str | None = None
    if isinstance(source, str | Path):
        path = Path(source)
        data, text = read_toml(path)
        label = str(source)
        base_dir = base_dir or path.resolve().parent
        if not data:
            raise ConfigError(
                f"{label}: the config is empty; it needs at least a [task] and a [train] "
                "section (see the files in examples/)"
            )
    else:
        data = copy.deepcopy(dict(source))
    overridden = apply_overrides(data, overrides)
    try:
        return ShoalConfig.model_validate(
            data, context={"base_dir": str(base_dir) if base_dir else None}
        )
    except ValidationError as exc:
        lines = format_errors(exc, data, ShoalConfig, label, text, overridden)
        raise ConfigError(*lines) from None


def default_run_name(source: ConfigSource) -> str:
    """A run's default name: the config file's name without its suffix."""
    if isinstance(source, str | Path):
        stem = re.sub(r"[^A-Za-z0-9._-]", "-", Path(source).stem).lstrip("._-")
        return stem or "run"
    return "run"


def dump_config(config: ShoalConfig) -> str:
    """The resolved config as TOML (defaults filled in, paths absolute)."""
    return tomli_w.dumps(config.model_dump(mode="json", exclude_none=True))
