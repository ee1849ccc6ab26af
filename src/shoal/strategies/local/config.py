"""`[strategy] type = "local"`: nothing to set."""

from __future__ import annotations

from typing import ClassVar, Literal

from shoal.config.base import LEARNERS, StrategySection


class LocalStrategyConfig(StrategySection):
    """One process trains on the whole dataset."""

    type: Literal["local"] = "local"
    in_process: ClassVar[bool] = True
    resumes_from: ClassVar[tuple[str, ...]] = (*LEARNERS, "pipeline")
    #: the optimizer applies the gradients as the model left them: sparse rows stay sparse
    carries_sparse_gradients: ClassVar[bool] = True
