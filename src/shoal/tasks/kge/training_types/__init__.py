"""Training types by name (`task.training.type`): negative_sampling, 1vsAll, KvsAll."""

from __future__ import annotations

from shoal.plugins.registry import closed_choice
from shoal.tasks.kge.config import KGETaskConfig
from shoal.tasks.kge.training_types.all_entities import KvsAll, OneVsAll
from shoal.tasks.kge.training_types.base import TrainingType
from shoal.tasks.kge.training_types.negative_sampling import NegativeSampling
from shoal.tasks.kge.triples import KGData

TRAINING_TYPES = closed_choice(
    "kge training type",
    "type",
    "shoal.tasks.kge.training_types",
    "shoal.tasks.kge.config",
    {
        "negative_sampling": ("NegativeSampling", "NegativeSamplingTraining"),
        "1vsAll": ("OneVsAll", "OneVsAllTraining"),
        "KvsAll": ("KvsAll", "KvsAllTraining"),
    },
)
"""The training types, by their config's `type`."""


def build_training_type(config: KGETaskConfig, data: KGData, seed: int) -> TrainingType:
    training: type[TrainingType] = TRAINING_TYPES.load(config.training.type)
    return training(config, data, seed)


__all__ = [
    "TRAINING_TYPES",
    "KvsAll",
    "NegativeSampling",
    "OneVsAll",
    "TrainingType",
    "build_training_type",
]
