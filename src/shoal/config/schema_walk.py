"""Find the config model and field type at a dotted path, following discriminated unions.

Both `--set a.b=value` (which needs the target type to parse the value) and the
error messages (which list the keys allowed where an unknown key was found) walk
the schema the same way: one walker serves both.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel

_DISCRIMINATORS = ("type", "kind", "source", "method")


def union_members(annotation: Any) -> list[Any]:
    """The alternatives of an annotation, with Annotated and Optional unwrapped."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return union_members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        members: list[Any] = []
        for arg in typing.get_args(annotation):
            members.extend(union_members(arg))
        return members
    return [annotation]


def _models(annotation: Any) -> list[type[BaseModel]]:
    return [m for m in union_members(annotation) if inspect.isclass(m) and issubclass(m, BaseModel)]


def _tag_of(model: type[BaseModel]) -> tuple[str, Any] | None:
    for name in _DISCRIMINATORS:
        field = model.model_fields.get(name)
        if field is not None and typing.get_origin(field.annotation) is Literal:
            return name, typing.get_args(field.annotation)[0]
    return None


def choose_model(annotation: Any, value: Any, default: Any = None) -> type[BaseModel] | None:
    """The member of a (possibly discriminated) union that `value` selects."""
    models = _models(annotation)
    if len(models) <= 1:
        return models[0] if models else None
    for model in models:
        tag = _tag_of(model)
        if tag and isinstance(value, dict) and value.get(tag[0]) == tag[1]:
            return model
    if isinstance(default, BaseModel):
        return type(default)
    return None


def union_tags(root: type[BaseModel], path: Sequence[str | int], data: Any) -> list[str]:
    """The discriminator values a union field at `path` accepts, in declaration order."""
    names = [p for p in path if isinstance(p, str)]
    if len(names) != len(path) or not names:
        return []
    annotation = annotation_at(root, names, data)
    tags = [_tag_of(m) for m in _models(annotation)]
    return [str(t[1]) for t in tags if t is not None]


def model_at(root: type[BaseModel], path: Sequence[str | int], data: Any) -> type[BaseModel] | None:
    """The config model that holds the keys at `path` (a table), or None."""
    model: type[BaseModel] | None = root
    node = data
    for key in path:
        if model is None or not isinstance(key, str) or key not in model.model_fields:
            return None
        field = model.model_fields[key]
        node = node.get(key) if isinstance(node, dict) else None
        model = choose_model(field.annotation, node, field.get_default(call_default_factory=True))
    return model


def annotation_at(root: type[BaseModel], path: Sequence[str], data: Any) -> Any:
    """The type annotation of the field at `path`, or None when the path is unknown."""
    parent = model_at(root, path[:-1], data)
    if parent is None or path[-1] not in parent.model_fields:
        return None
    return parent.model_fields[path[-1]].annotation


def is_text(annotation: Any) -> bool:
    """True when every alternative of the field is a string (str or a Literal of strings)."""
    members = [m for m in union_members(annotation) if m is not type(None)]
    if not members:
        return False
    for member in members:
        if member is str:
            continue
        if typing.get_origin(member) is Literal and all(
            isinstance(a, str) for a in typing.get_args(member)
        ):
            continue
        return False
    return True
