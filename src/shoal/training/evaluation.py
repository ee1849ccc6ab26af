"""Evaluating a task's splits and recording the figures: one piece for every loop.

The trainer (after validation, and with the best model on the test splits) and the
federated round loop all evaluate the same way: each split the task names, collectively,
then the same record in metrics.jsonl, the progress display and the worker log.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from torch import nn

from shoal.monitor.metrics import MetricsLog
from shoal.monitor.progress import ProgressReporter
from shoal.protocols.task import Task


def evaluate_splits(
    task: Task,
    model: nn.Module,
    splits: Iterable[str],
    *,
    event: dict[str, Any],
    label: str,
    metrics: MetricsLog,
    reporter: ProgressReporter,
    log: logging.Logger,
    into: dict[str, dict[str, float]],
) -> None:
    """Evaluate `splits` (every rank calls this) and record each split's figures.

    `event` opens the metrics.jsonl record (e.g. {"event": "eval", "step": 100});
    `label` says when, for people ("step 100 epoch 2"). A split whose evaluation
    returns nothing is skipped; the others land in `into[split]`.
    """
    for split in splits:
        figures = task.evaluate(model, split)
        if not figures:
            continue
        into[split] = figures
        metrics.write({**event, "split": split, **figures})
        shown = "  ".join(f"{k} {v:.4f}" for k, v in figures.items())
        reporter.note(f"{label} {split}: {shown}")
        log.info("%s %s: %s", label, split, shown)
