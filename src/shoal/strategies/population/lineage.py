"""The population's history: per generation and member, hyperparameters, score and parent.

`parent` is the member whose weights a member took at the start of a generation
(by exploiting it), or None when it went on with its own. Following parents
backwards from a member gives the hyperparameter *schedule* its weights were
actually trained with: PBT's result is a model and a schedule, not one setting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from shoal.strategies.population.space import Hyperparameters


@dataclass
class MemberRecord:
    """One member in one generation."""

    hyperparameters: Hyperparameters
    score: float
    parent: int | None
    train_loss: float = math.nan
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "hyperparameters": self.hyperparameters,
            "score": self.score,
            "parent": self.parent,
            "train_loss": self.train_loss,
            "error": self.error,
            "metrics": self.metrics,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MemberRecord:
        return cls(**data)


@dataclass
class Generation:
    """A finished generation: the steps [start, end) it trained, and each member's record."""

    index: int
    start: int
    end: int
    members: list[MemberRecord]

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "start": self.start,
            "end": self.end,
            "members": [m.to_json() for m in self.members],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Generation:
        members = [MemberRecord.from_json(m) for m in data["members"]]
        return cls(data["index"], data["start"], data["end"], members)


def schedule(history: list[Generation], member: int) -> list[dict[str, Any]]:
    """The hyperparameters `member`'s final weights were trained with, generation by generation.

    Walks back through parents: in generation g the weights were those of
    `member` if it kept its own, else of the parent it copied at the start of g.
    """
    steps: list[dict[str, Any]] = []
    current = member
    for generation in reversed(history):
        record = generation.members[current]
        steps.append(
            {
                "generation": generation.index,
                "steps": [generation.start, generation.end],
                "member": current,
                "hyperparameters": record.hyperparameters,
                "score": record.score,
            }
        )
        if record.parent is not None:
            current = record.parent
    return steps[::-1]
