"""A checkpoint's record of the data it was trained on: every file the config names.

The config says *where* the data is; a resume also needs to know whether what is
there is still the same. Each `ExistingFile` field of the config (training
triples, a CSV, validation files, a sharding file) is recorded by size and
sha256, under the field's dotted path, so a changed file is reported as a change
of the field that names it. Hashing reads each file once per process (cached by
path, size and modification time): a second per GiB or so, once per job.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from shoal.checkpoint.integrity import sha256_file
from shoal.config.base import is_file_field


def file_fields(model: BaseModel, prefix: str = "") -> dict[str, str]:
    """{dotted field path: file path} for every ExistingFile set in `model`, recursively."""
    found: dict[str, str] = {}
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        path = f"{prefix}.{name}" if prefix else name
        if isinstance(value, BaseModel):
            found.update(file_fields(value, path))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, BaseModel):
                    found.update(file_fields(item, f"{path}[{index}]"))
        elif isinstance(value, str) and is_file_field(info):
            found[path] = value
    return found


@functools.lru_cache(maxsize=64)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    return sha256_file(Path(path))


def describe_file(path: str) -> dict[str, Any]:
    """{"size", "sha256"} of a file; {"missing": true} if it is gone."""
    try:
        stat = os.stat(path)
    except OSError:
        return {"missing": True}
    return {"size": stat.st_size, "sha256": _digest(path, stat.st_size, stat.st_mtime_ns)}


def data_fingerprint(config: BaseModel) -> dict[str, dict[str, Any]]:
    """What a checkpoint records about the files its config names."""
    return {field: describe_file(path) for field, path in sorted(file_fields(config).items())}
