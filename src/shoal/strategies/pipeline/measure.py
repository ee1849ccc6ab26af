"""What a pipeline rank does with its time and memory: compute, idle, peak.

Compute is measured where torch's schedule computes: each stage object's
`forward_one_chunk`, `backward_one_chunk` and `backward_weight_one_chunk` are
timed (wrapped on the instance), and so is the loss of the last stage (a rank
slowed by `[faults.inject] kind = "slow"` sleeps in each of them, in proportion,
as a slower machine computes longer). The
rest of the schedule's `step` is the rank waiting: for the activations or
gradients of a neighbour (the bubble) and for the messages themselves. So the
measured bubble fraction of a rank is (step time - compute time) / step time,
which on CPU with gloo also holds the time to copy messages; the fraction
reported is the mean over the ranks, next to the schedule's theoretical one
(`stages.bubble_theory`).

Memory: the bytes of this rank's parameters, gradients and optimizer state
(exact), and the process's peak resident memory (on CUDA, the allocator's peak).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from typing import Any

from shoal.runtime.collectives import Peers, gather_bytes
from shoal.training.faults import straggle

TIMED = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")


class StageClock:
    """Seconds this rank computed and spent in schedule steps, since the last `take`."""

    def __init__(self) -> None:
        self.compute_s = 0.0
        self.step_s = 0.0
        self.steps = 0

    def wrap(self, stage: Any) -> None:
        """Time `stage`'s compute methods (instance attributes shadow the class's)."""
        for name in TIMED:
            setattr(stage, name, self.timed(getattr(stage, name)))

    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                straggle(started)  # `[faults.inject] kind = "slow"`: a slower machine
                self.compute_s += time.perf_counter() - started

        return run

    def take(self) -> tuple[float, float, int]:
        """(compute seconds, step seconds, steps) since the last call."""
        figures = (self.compute_s, self.step_s, self.steps)
        self.compute_s, self.step_s, self.steps = 0.0, 0.0, 0
        return figures


def gather_figures(ctx: Peers, figures: dict[str, float]) -> list[dict[str, float]]:
    """Collective: every rank's figures (JSON over the wire), indexed by rank."""
    return [json.loads(blob) for blob in gather_bytes(ctx, json.dumps(figures).encode())]
