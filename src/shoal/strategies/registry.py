"""The strategy a `[strategy]` section names (`type`, or `type = "custom"` and its `class`)."""

from __future__ import annotations

from typing import Any

from shoal.config.custom import section_class
from shoal.plugins.kinds import STRATEGIES
from shoal.strategies.base import Strategy


def strategy_class(section: Any) -> type[Strategy]:
    """The class of a validated `[strategy]` section (or of a strategy name)."""
    cls: type[Strategy] = section_class(STRATEGIES, section)
    return cls
