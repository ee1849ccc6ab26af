"""`[strategy] type = "local"`: nothing to set."""

from __future__ import annotations

from typing import Literal

from shoal.config.base import StrategySection


class LocalStrategyConfig(StrategySection):
    """One process trains on the whole dataset."""

    type: Literal["local"] = "local"
