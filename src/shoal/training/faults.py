"""`[faults.inject]`: break a worker on purpose, to test how a job handles faults.

One mechanism for every loop that trains (the Trainer, a population's members,
federated rounds): each calls :func:`maybe_inject_fault` before a step with the
step it is about to take, and calls what it returns after the step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch
from torch import nn

from shoal.errors import ShoalError
from shoal.runtime.context import WorkerContext

INJECTED_EXIT_CODE = 17


class Slowdown:
    """How many times slower this process computes: `[faults.inject] kind = "slow"` with a
    `factor` sets it while a step runs, and :func:`straggle` (called by the learner after
    each micro-batch's forward and backward) sleeps the difference. Work-proportional, so
    a load balancer that gives this rank less work really makes it finish sooner."""

    factor: float = 1.0


SLOWDOWN = Slowdown()


def straggle(started: float) -> None:
    """Sleep (factor - 1) x the time since `started` if this rank is slowed (else nothing)."""
    if SLOWDOWN.factor > 1.0:
        time.sleep((SLOWDOWN.factor - 1.0) * (time.perf_counter() - started))


def _steady() -> None:
    SLOWDOWN.factor = 1.0


class InjectedFault(RuntimeError):
    """Raised by `[faults.inject] kind = "raise"`."""


def _nothing() -> None:
    return None


def maybe_inject_fault(
    ctx: WorkerContext, step: int, model: nn.Module | None = None
) -> Callable[[], None]:
    """Break this rank if `[faults.inject]` names it and `step`; returns what undoes it.

    `nan` turns this step's gradient of `model`'s first parameter into NaN through
    a hook, which the returned callable removes after the step; `slow` with a `factor`
    slows this rank's compute until the returned callable is called. A resumed run is
    never broken again (nor a run the launcher restarted), so a run failed on purpose
    can be resumed (which is what the tests of resume do).
    """
    fault = ctx.config.faults.inject
    if fault is None or ctx.resume_from or ctx.restart or fault.rank != ctx.rank:
        return _nothing
    if fault.kind == "slow":  # a straggler: every step from `step` on
        if step < fault.step:
            return _nothing
        if fault.factor is None:
            time.sleep(fault.delay_s)
            return _nothing
        SLOWDOWN.factor = fault.factor
        return _steady
    if fault.step != step:
        return _nothing
    ctx.log.error("fault injection: %s at step %d", fault.kind, step)
    if fault.kind == "nan":
        if model is None:
            raise ShoalError(
                'faults.inject: kind = "nan" poisons a gradient step; this strategy injects it '
                "nowhere (use raise, exit or hang)"
            )
        first = next(p for p in model.parameters() if p.requires_grad)
        hook = first.register_hook(lambda grad: torch.full_like(grad, float("nan")))
        return hook.remove
    if fault.kind == "raise":
        raise InjectedFault(f"injected fault at step {step}")
    if fault.kind == "exit":
        for handler in ctx.log.handlers:
            handler.flush()
        os._exit(INJECTED_EXIT_CODE)
    if ctx.heartbeat is not None:
        ctx.heartbeat.stop()
    while True:  # kind == "hang": a frozen worker, as far as anyone can tell
        time.sleep(3600)
