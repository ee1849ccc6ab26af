"""`local`: one process, the whole dataset."""

from __future__ import annotations

from typing import ClassVar

from shoal.strategies.base import Strategy
from shoal.strategies.local.config import LocalStrategyConfig


class LocalStrategy(Strategy[LocalStrategyConfig]):
    """Trains in the calling process; no process group, no communication (the base
    strategy's local gradient sync and step loop)."""

    config_class: ClassVar[type[LocalStrategyConfig]] = LocalStrategyConfig
