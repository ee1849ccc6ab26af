"""shoal's extension surface: every name a plugin needs, in one place.

A strategy, a task, an aggregation method or a KG model written outside shoal
imports from here and nowhere else in shoal. The three ways to write a strategy
need these names:

- **the shared step loop** (a new gradient sync: local SGD, a compressor): a
  `StrategySection` (its config, which says how many processes), a `Strategy`
  whose `attach` returns a `GradientSync`;
- **a unit of its own** (rounds, generations): the same, and a `UnitLoop` whose
  `__init__` sets its `Plan` and which says `done`, `run_unit` and its
  `model_of_record`, handed to `Strategy.drive`;
- **a model held elsewhere** (servers, stages): a `StepLoop` subclass that
  overrides what differs (`build_model`, `make_learner`, `make_record`, ...).

A task is a `TaskSection` and a `Task` (its loss a `LossOutput` sum); what it
offers beyond that is a capability (`PIPELINE_STAGES`, ...).

**Stability.** These names keep their meaning and signatures within a minor
version (0.x); a change is announced in CHANGELOG.md one minor version before it
lands. Anything imported from another module of shoal may move without notice.

Importing this module is light (no torch): each name is imported when it is
first used, so a plugin's config module can take its base class from here and
`shoal config validate` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: each published name -> "module:attribute" where it lives
_NAMES: dict[str, str] = {
    # config: sections, their fields' helpers, their errors
    "ConfigModel": "shoal.config.base:ConfigModel",
    "StrategySection": "shoal.config.base:StrategySection",
    "TaskSection": "shoal.config.base:TaskSection",
    "ExistingFile": "shoal.config.base:ExistingFile",
    "FieldError": "shoal.config.base:FieldError",
    "RESUME_SAFE": "shoal.config.base:RESUME_SAFE",
    "RESUME_FIXED": "shoal.config.base:RESUME_FIXED",
    # strategies: what runs in a worker, its gradient sync, its loop
    "Strategy": "shoal.strategies.base:Strategy",
    "GradientSync": "shoal.training.contracts:GradientSync",
    "UnitLoop": "shoal.training.loop:UnitLoop",
    "Plan": "shoal.training.loop:Plan",
    "Run": "shoal.training.loop:Run",
    "ModelOfRecord": "shoal.training.loop:ModelOfRecord",
    "StepLoop": "shoal.training.steps:StepLoop",
    "WorkerContext": "shoal.runtime.context:WorkerContext",
    # tasks: the contract and what a task may offer
    "Task": "shoal.protocols.task:Task",
    "LossOutput": "shoal.protocols.task:LossOutput",
    "Capability": "shoal.protocols.capabilities:Capability",
    "PIPELINE_STAGES": "shoal.protocols.capabilities:PIPELINE_STAGES",
    "TENSOR_PLAN": "shoal.protocols.capabilities:TENSOR_PLAN",
    "SHARD_UNITS": "shoal.protocols.capabilities:SHARD_UNITS",
    "SERVED_TABLES": "shoal.protocols.capabilities:SERVED_TABLES",
    "CLASS_LABELS": "shoal.protocols.capabilities:CLASS_LABELS",
    "CLIENT_FILES": "shoal.protocols.capabilities:CLIENT_FILES",
    # helpers a plugin's code uses: batches, collectives, non-finite checks, data, errors
    "move_to": "shoal.protocols.task:move_to",
    "rank_slice": "shoal.protocols.task:rank_slice",
    "all_reduce_sum": "shoal.runtime.collectives:all_reduce_sum",
    "gather_tensors": "shoal.runtime.collectives:gather_tensors",
    "nonfinite_names": "shoal.training.nonfinite:nonfinite_names",
    "agree_on_nonfinite": "shoal.training.nonfinite:agree_on_nonfinite",
    "read_text": "shoal.textfile:read_text",
    "ShoalError": "shoal.errors:ShoalError",
    "DataError": "shoal.errors:DataError",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    target = _NAMES.get(name)
    if target is None:
        raise AttributeError(f"module 'shoal.extend' has no attribute {name!r}")
    module, _, attribute = target.partition(":")
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # the same names, for type checkers
    pass
