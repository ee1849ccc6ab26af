"""What a resume may change: the config asked for, compared with the one a checkpoint holds.

Every field that differs falls in one of three classes:

- **safe**: how long, how often, where and on how many workers the run trains,
  how it is watched (`train.epochs`, `[checkpoint]`, `[monitor]`, `[faults]`,
  `[run]`, the strategy's worker count...): the fields marked `RESUME_SAFE`;
- **changes the problem**: the run continues, but no longer trains what its
  checkpoints trained (learning rate, optimizer kind, loss, seed, dataset size,
  the content of a data file...). Refused unless the user says `--allow-changes`;
  when allowed, logged and recorded in metrics.jsonl (`config_change`);
- **incompatible**: the saved state cannot load (model shape, data that changes
  the id maps, a parameter server's optimizer kind): the fields marked
  `RESUME_FIXED`. Always refused.

The policy lives on the fields themselves (`json_schema_extra`, `config/base.py`),
so `shoal config schema` shows it beside each field's help, and the rules a resume
applies are read off the config being resumed (`resume_rules`): a plugin's fields
carry their own.

The safe fields are an allow-list: a field nobody classified (a new one) changes
the problem until someone says otherwise, so it is refused by default. A changed
variant (`type`, `kind`, `source`, `method`) is one change; the fields under it
are not compared one by one.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel

from shoal.checkpoint.fingerprint import data_fingerprint
from shoal.checkpoint.integrity import checkpoint_config_text
from shoal.config import ShoalConfig, dump_config
from shoal.config.custom import own_config
from shoal.errors import ConfigError

SAFE = "safe"
CHANGES_PROBLEM = "changes the problem"
INCOMPATIBLE = "incompatible"

DISCRIMINATORS = ("type", "kind", "source", "method")
_UNSET = object()


@dataclass(frozen=True)
class Change:
    """One field that differs: what the checkpoint holds and what was asked, as shown to
    the user, and its class (SAFE, CHANGES_PROBLEM or INCOMPATIBLE)."""

    field: str
    saved: str
    asked: str
    kind: str

    def text(self) -> str:
        return f"the checkpoint holds {self.saved}, asked {self.asked}"

    def record(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "checkpoint": self.saved,
            "asked": self.asked,
            "class": self.kind,
        }


def _show(value: Any) -> str:
    if value is _UNSET:
        return "nothing (unset)"
    if isinstance(value, dict) and "sha256" in value:
        return f"a file of {value['size']} bytes (sha256 {str(value['sha256'])[:12]})"
    if isinstance(value, dict) and value.get("missing"):
        return "a missing file"
    return json.dumps(value)


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flatten(value, f"{prefix}.{key}" if prefix else key))
    return out


@dataclass(frozen=True)
class ResumeRules:
    """The field patterns a resume may change freely (`safe`) or never (`incompatible`)."""

    safe: tuple[str, ...] = ()
    incompatible: tuple[str, ...] = ()
    #: strategy types whose checkpoints load under this one (the same parts in the same
    #: layout): a change of `strategy.type` from one of them is safe, from others refused
    strategy_types: tuple[str, ...] = ()

    def classify(self, field: str, saved: Any) -> str:
        if field == "strategy.type" and saved in self.strategy_types:
            return SAFE
        return classify(field, self.safe, self.incompatible)


def resume_rules(config: ShoalConfig) -> ResumeRules:
    """What a resume of `config` may change, read off its fields' `resume` marks (and the
    strategy types its strategy resumes from).

    A marked field covers everything below it; a field that chooses among variants (a
    union: `task`, `strategy`, a KG model) marked incompatible covers its variant tag
    only, the fields inside each variant keeping their own marks. Every variant of a
    union inside a section is read, not only the chosen one (the rules describe the
    section's schema); of the root's task and strategy, the chosen type's alone (another
    type has rules of its own, and changing the type is refused anyway)."""
    safe: list[str] = []
    incompatible: list[str] = []
    seen: set[tuple[str, type[BaseModel]]] = set()

    def walk(model: type[BaseModel], value: Any, prefix: str) -> None:
        if (prefix, model) in seen:
            return
        seen.add((prefix, model))
        for name, info in model.model_fields.items():
            path = f"{prefix}{info.alias or name}"
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            kind = extra.get("resume")
            if kind == "safe":
                safe.extend((path, f"{path}.*"))
            elif kind == "incompatible" and info.discriminator:
                incompatible.append(f"{path}.{info.discriminator}")
            elif kind == "incompatible":
                incompatible.extend((path, f"{path}.*"))
            child = getattr(value, name, None) if value is not None else None
            variants = [] if model is type(config) else _models(info.annotation)
            for nested in variants:
                walk(nested, child if isinstance(child, nested) else None, f"{path}.")
            if isinstance(child, BaseModel):  # the chosen variant (a plugin's own section)
                walk(type(child), child, f"{path}.")

    walk(type(config), config, "")
    section = own_config(config.strategy)
    return ResumeRules(tuple(safe), tuple(incompatible), getattr(section, "resumes_from", ()))


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The config models a field's annotation names (through unions, `Annotated`, options)."""
    if isinstance(annotation, type):
        return [annotation] if issubclass(annotation, BaseModel) else []
    return [model for arg in get_args(annotation) for model in _models(arg)]


def classify(field: str, safe: tuple[str, ...], incompatible: tuple[str, ...]) -> str:
    if any(fnmatchcase(field, pattern) for pattern in incompatible):
        return INCOMPATIBLE
    if any(fnmatchcase(field, pattern) for pattern in safe):
        return SAFE
    return CHANGES_PROBLEM


def _differences(saved: dict[str, Any], asked: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    a, b = _flatten(saved), _flatten(asked)
    diff = {
        key: (a.get(key, _UNSET), b.get(key, _UNSET))
        for key in sorted(a.keys() | b.keys())
        if a.get(key, _UNSET) != b.get(key, _UNSET)
    }
    switched = {key.rpartition(".")[0] for key in diff if key.rpartition(".")[2] in DISCRIMINATORS}

    def under_switched(key: str) -> bool:
        """Inside a table whose variant changed (that variant's own tag is reported)."""
        table, _, name = key.rpartition(".")
        return any(
            key.startswith(f"{t}.") and not (t == table and name in DISCRIMINATORS)
            for t in switched
        )

    return {key: values for key, values in diff.items() if not under_switched(key)}


def resume_changes(
    checkpoint: Path,
    meta: dict[str, Any],
    config: ShoalConfig,
    rules: ResumeRules,
    train_size: int | None = None,
) -> list[Change]:
    """Every difference between the run a checkpoint holds and `config`, classified.

    Files are compared by content: the same data at a new path is no change, a file
    changed behind an unchanged path is a change of the field that names it.
    `train_size` (known once the task is built) is compared with the checkpoint's.
    """
    saved = tomllib.loads(checkpoint_config_text(checkpoint, meta))
    asked = tomllib.loads(dump_config(config))
    safe, incompatible = rules.safe, rules.incompatible
    saved_files: dict[str, Any] | None = meta.get("data")
    files_now = data_fingerprint(config) if saved_files is not None else {}
    changes: list[Change] = []
    for field, (before, after) in _differences(saved, asked).items():
        kind = rules.classify(field, before)
        if saved_files and field in saved_files and saved_files[field] == files_now.get(field):
            kind = SAFE  # the same file, moved
        changes.append(Change(field, _show(before), _show(after), kind))
    paths_before, paths_now = _flatten(saved), _flatten(asked)
    for field in sorted((saved_files or {}).keys() & files_now.keys()):
        before, after = (saved_files or {})[field], files_now[field]
        if paths_before.get(field) == paths_now.get(field) and before != after:
            kind = classify(field, safe, incompatible)
            changes.append(Change(field, _show(before), _show(after), kind))
    saved_size = meta.get("train_size")
    if train_size is not None and isinstance(saved_size, int) and saved_size != train_size:
        kind = classify("task.data", safe, incompatible)
        before, after = f"{saved_size} training samples", f"{train_size} training samples"
        changes.append(Change("task.data", before, after, kind))
    return changes


def refuse_changes(changes: list[Change], checkpoint: Path, allow: bool) -> None:
    """Raise one line per change a resume may not make: incompatible ones always, those that
    change the problem unless `allow` (--allow-changes)."""
    lines = [
        f"{c.field}: cannot change when resuming from {checkpoint}: {c.text()}; the saved "
        "state cannot load with it: resume without this change, or start a new run"
        for c in changes
        if c.kind == INCOMPATIBLE
    ]
    if not allow:
        lines += [
            f"{c.field}: resuming from {checkpoint} with this change would change what the run "
            f"trains: {c.text()}; pass --allow-changes to resume with it anyway, or drop it"
            for c in changes
            if c.kind == CHANGES_PROBLEM
        ]
    if lines:
        raise ConfigError(*lines)
