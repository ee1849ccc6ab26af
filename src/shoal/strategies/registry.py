"""The strategy a `[strategy]` section names (`type`, or `type = "custom"` and its `class`)."""

from __future__ import annotations

from typing import Any

from shoal.config.custom import custom_plugin
from shoal.plugins.kinds import STRATEGIES
from shoal.strategies.base import Strategy


def strategy_class(section: Any) -> type[Strategy]:
    """The class of a validated `[strategy]` section (or of a strategy name)."""
    name = section if isinstance(section, str) else section.type
    if name == "custom":
        return custom_plugin(STRATEGIES, section.class_).load()
    cls: type[Strategy] = STRATEGIES.load(name)
    return cls
