"""Where a run stands: the data position and totals saved in every checkpoint."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class TrainProgress:
    """The data position (epoch, step within it) and running totals of a run.

    Everything needed, with the RNG states, to continue exactly where a checkpoint
    was taken: the batches of an epoch are a function of (seed, epoch), so
    (epoch, step_in_epoch) locates the next batch.
    """

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    samples_seen: int = 0
    train_time_s: float = 0.0
    compute_time_s: float = 0.0
    comm_time_s: float = 0.0
    sent_bytes: float = 0.0
    skipped_steps: int = 0
    best_metric: float | None = None  # best validation value of the task's primary metric
    best_step: int = -1
    evals_without_improvement: int = 0
    stopped_early: bool = False
    checkpoints_written: int = 0  # periodic, stop and final checkpoints (not best/)
    checkpoint_time_s: float = 0.0  # this rank's seconds writing them

    @property
    def last_step_epoch(self) -> int:
        """The epoch the latest step belongs to. `epoch` moves on as soon as an epoch's
        last step is taken, so reporting the end of a run by `epoch` shows one epoch too
        many ("epoch 3/2")."""
        return self.epoch - 1 if self.step_in_epoch == 0 and self.global_step > 0 else self.epoch

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            if hasattr(self, key):
                setattr(self, key, value)
