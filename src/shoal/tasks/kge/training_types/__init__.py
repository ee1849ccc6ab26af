"""Training types by name (`task.training.type`): negative_sampling, 1vsAll, KvsAll."""

from __future__ import annotations

from collections.abc import Callable

from shoal.registry import Registry
from shoal.tasks.kge.config import KGETaskConfig
from shoal.tasks.kge.training_types.all_entities import KvsAll, OneVsAll
from shoal.tasks.kge.training_types.base import TrainingType
from shoal.tasks.kge.training_types.negative_sampling import NegativeSampling
from shoal.tasks.kge.triples import KGData

TRAINING_TYPES: Registry[Callable[[KGETaskConfig, KGData, int], TrainingType]] = Registry(
    "kge training type"
)
TRAINING_TYPES.add("negative_sampling", NegativeSampling)
TRAINING_TYPES.add("1vsAll", OneVsAll)
TRAINING_TYPES.add("KvsAll", KvsAll)


def build_training_type(config: KGETaskConfig, data: KGData, seed: int) -> TrainingType:
    return TRAINING_TYPES.get(config.training.type)(config, data, seed)


def unserved_reason(config: KGETaskConfig) -> str | None:
    """Why a parameter server cannot train `config` (None: it can)."""
    training = TRAINING_TYPES.get(config.training.type)
    reason = getattr(training, "unserved_reason", None)
    if reason is not None:
        return f"task.training.type = {config.training.type!r}: {reason}"
    regularization = config.regularization
    if regularization is not None and not regularization.weighted:
        return (
            "task.regularization.weighted = false penalises every row of both tables each "
            "step, which a worker never holds; set weighted = true"
        )
    return None


__all__ = ["TRAINING_TYPES", "TrainingType", "build_training_type", "unserved_reason"]
