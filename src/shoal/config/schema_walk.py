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

from shoal.config.base import fields_by_key

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
    """The discriminator values a union field at `path` accepts, in declaration order.

    `custom` (a class named by a dotted path) is left out: it is no registered name."""
    names = [p for p in path if isinstance(p, str)]
    if len(names) != len(path) or not names:
        return []
    annotation = annotation_at(root, names, data)
    tags = [_tag_of(m) for m in _models(annotation)]
    return [str(t[1]) for t in tags if t is not None and t[1] != "custom"]


def _dict_values(annotation: Any) -> Any | None:
    """The value type of a `dict[str, X]` field (its keys are names the user picks), or None."""
    for member in union_members(annotation):
        if typing.get_origin(member) is dict:
            return typing.get_args(member)[1]
    return None


def _walk(root: type[BaseModel], path: Sequence[str | int], data: Any) -> tuple[Any, Any]:
    """(annotation, model) at the end of `path`; a key of a dict field selects its value type."""
    annotation: Any = root
    model: type[BaseModel] | None = root
    node = data
    values: Any | None = None  # set when the previous key was a dict field
    for key in path:
        if not isinstance(key, str):
            return None, None
        fields = fields_by_key(model) if model is not None else {}
        nested = getattr(model, "nested_model", None)  # `config` of a `type = "custom"` table
        parent = node
        if values is not None:
            annotation, default = values, None
        elif key in fields:
            field = fields[key]
            annotation, default = field.annotation, field.get_default(call_default_factory=True)
        else:
            return None, None
        node = node.get(key) if isinstance(node, dict) else None
        values = _dict_values(annotation)
        model = choose_model(annotation, node, default)
        if model is None and nested is not None:
            model = nested(key, parent)
            annotation = model if model is not None else annotation
    return annotation, model


def model_at(root: type[BaseModel], path: Sequence[str | int], data: Any) -> type[BaseModel] | None:
    """The config model that holds the keys at `path` (a table), or None."""
    model: type[BaseModel] | None = _walk(root, path, data)[1]
    return model


def annotation_at(root: type[BaseModel], path: Sequence[str], data: Any) -> Any:
    """The type annotation of the field at `path`, or None when the path is unknown."""
    if not path:
        return None
    return _walk(root, path, data)[0]


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
