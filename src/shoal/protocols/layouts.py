"""Laying any model out by name: the modules a class name or a path pattern names, and the
torch parallel styles a plan's kinds stand for.

Shared by the strategies (a plan or a wrap list given in `[strategy]` applies to any
model) and the tasks (a family's plan, written as patterns over its module paths).
Config sections import it to check names, so torch is imported only where a function
needs it (`TYPE_CHECKING` names the types).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, get_args

from shoal.errors import ShoalError

if TYPE_CHECKING:
    from torch import nn


def modules_of_classes(model: nn.Module, names: Iterable[str]) -> list[nn.Module]:
    """Every submodule whose class is named in `names`, innermost first (FSDP wraps the
    inner units before those that hold them)."""
    wanted = set(names)
    found = [
        (path.count("."), m) for path, m in model.named_modules() if type(m).__name__ in wanted
    ]
    return [module for _, module in sorted(found, key=lambda item: -item[0])]


#: the styles a plan names, as torch's `parallelize_module` offers them
Style = Literal["colwise", "rowwise", "colwise_gather", "rowwise_embedding", "sequence_parallel"]
STYLES: tuple[str, ...] = get_args(Style)


def meta_model(config: Any) -> nn.Module | None:
    """The task's model built on the meta device, to check names against (None: the task
    cannot say before it trains)."""
    task = config.task
    section = task.config if getattr(task, "type", None) == "custom" else task
    build = getattr(section, "meta_model", None)
    return build() if callable(build) else None


def block_classes(model: nn.Module) -> list[str]:
    """The classes of the model's lists of two or more same-class children."""
    from torch import nn

    found = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList | nn.ModuleDict | nn.Sequential):
            kinds = {type(child).__name__ for child in module.children()}
            if len(kinds) == 1 and len(module) >= 2:
                found.append(kinds.pop())
    return sorted(set(found))


def style(kind: str, sequence_parallel: bool = False) -> Any:
    """The torch ParallelStyle of a plan entry's kind."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    between = Shard(1) if sequence_parallel else Replicate()
    if kind == "colwise":
        return ColwiseParallel()
    if kind == "rowwise":
        return RowwiseParallel(output_layouts=between)
    if kind == "colwise_gather":  # a head: logits gathered whole
        return ColwiseParallel(input_layouts=between, output_layouts=Replicate())
    if kind == "rowwise_embedding":  # an embedding split by vocabulary rows
        return RowwiseParallel(input_layouts=Replicate(), output_layouts=between)
    if kind == "sequence_parallel":
        return SequenceParallel()
    raise ValueError(f"unknown parallel style {kind!r}")


def pattern_names(model: nn.Module, pattern: str) -> list[str]:
    """The module paths a plan pattern (`*` for one path part) names."""
    regex = re.compile("^" + re.escape(pattern).replace(r"\*", r"[^.]+") + "$")
    return [path for path, _ in model.named_modules() if path and regex.match(path)]


def plan_from_patterns(
    model: nn.Module, patterns: Mapping[str, str], sequence_parallel: bool, missing_ok: bool = False
) -> dict[str, Any]:
    """{module path: style} of a plan given by patterns. Every pattern must name a module,
    unless `missing_ok` (a pipeline stage holds only some of the model's modules)."""
    plan: dict[str, Any] = {}
    for pattern, kind in patterns.items():
        names = pattern_names(model, pattern)
        if not names and not missing_ok:
            raise ShoalError(
                f"strategy.plan: {pattern!r} names no module of {type(model).__name__}; "
                f"nearest: {', '.join(nearest(model, pattern)) or 'none'}"
            )
        for name in names:
            plan[name] = style(kind, sequence_parallel)
    return plan


def nearest(model: nn.Module, pattern: str, count: int = 5) -> list[str]:
    """The module paths most like `pattern`, by their longest common run of characters."""
    paths = [path for path, _ in model.named_modules() if path]
    return difflib.get_close_matches(pattern, paths, n=count, cutoff=0.3)
