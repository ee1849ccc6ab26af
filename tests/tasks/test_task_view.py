"""`Task.on(ctx)`: a view of a task whose collectives run among other ranks (issue 11).

A strategy that evaluates within a group of its own (the parameter server's workers) or
on one worker alone (a population's members) takes such a view; the task everyone shares
keeps its context, and the view shares its data rather than copying it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from shoal.tasks.classification.task import ClassificationTask
from tests.conftest import one_worker_context, small_job


def test_a_view_evaluates_among_its_own_ranks_and_shares_the_data(runs: Path) -> None:
    ctx = one_worker_context(small_job(runs))
    task = ClassificationTask(ctx)
    second_of_two = dataclasses.replace(ctx, rank=1, world_size=2)
    view = task.on(second_of_two)
    assert view.ctx is second_of_two and task.ctx is ctx
    assert view.data is task.data
    torch.manual_seed(0)
    model = task.build_model()
    whole = task.evaluate(model, "valid")
    assert task.on(ctx).evaluate(model, "valid") == whole
    # rank 1 of 2 scores its half of the split alone (no group to sum over here)
    half = view.evaluate(model, "valid")
    assert half != whole
