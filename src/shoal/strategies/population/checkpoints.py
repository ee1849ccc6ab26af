"""A population's checkpoints: every member's state, gathered on rank 0, and the bookkeeping.

The bookkeeping (generation, hyperparameters, parents, history) is the same on
every rank and is saved as JSON; each member's state (model, optimizer,
schedule, data position, generators) comes from the worker that holds it, as
tensors. Every rank reads the checkpoint on resume and takes its own members,
so a resume may use another number of workers.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.checkpoint.parts import Custom, Fixed, RankRngs, StatePart
from shoal.checkpoint.resume import open_resume
from shoal.config import dump_config
from shoal.errors import ShoalError
from shoal.strategies.population.lineage import Generation
from shoal.strategies.population.transfer import recv_tree, send_tree

if TYPE_CHECKING:
    from shoal.strategies.population.loop import PopulationTrainer


def bookkeeping(trainer: PopulationTrainer) -> dict[str, Any]:
    """The population's bookkeeping: the same on every rank, saved as JSON."""
    return {
        "next_generation": trainer.next_generation,
        "hyperparameters": trainer.hyper,
        "parents": trainer.parents,
        "history": [g.to_json() for g in trainer.history],
        "failures": trainer.failures,
        "replaced": trainer.replaced,
        "samples": trainer.samples,
        "times": trainer.times,
    }


def gather_members(trainer: PopulationTrainer) -> list[Any]:
    """Collective: every member's state, in member order, on rank 0 (empty elsewhere)."""
    ctx = trainer.ctx
    states: list[Any] = []
    for m in range(trainer.size):
        src = trainer.owner(m)
        what = f"member {m}'s state for the checkpoint"
        if ctx.is_main:
            if src == 0:
                states.append(trainer.members[m].state_dict())
            else:
                states.append(recv_tree(ctx, src, what))
        elif src == ctx.rank:
            send_tree(ctx, trainer.members[m].state_dict(), 0, what)
    return states


def _loaded_elsewhere(state: Any) -> None:
    """Members are loaded by `restore`, each worker taking its own."""


def save(trainer: PopulationTrainer) -> None:
    """Collective: rank 0 receives every member's state (in member order) and writes."""
    ctx = trainer.ctx
    started = time.perf_counter()
    parts: dict[str, StatePart] = {
        "members": Custom(lambda: gather_members(trainer), _loaded_elsewhere),
        "population": Fixed(json.dumps(bookkeeping(trainer))),
        "config": Fixed(dump_config(ctx.config)),
        "rng": RankRngs(ctx),
    }
    step = trainer.history[-1].end if trainer.history else 0
    meta = {"generation": trainer.next_generation, "train_size": trainer.task.train_size}
    path = trainer.checkpoints.save(step, parts, meta)
    trainer.times["checkpoint"] += time.perf_counter() - started
    if path is not None:
        trainer.last_checkpoint = path
        trainer.metrics.write(
            {
                "event": "checkpoint",
                "step": step,
                "generation": trainer.next_generation,
                "path": str(path),
            }
        )
        ctx.log.info("checkpoint written: %s", path)
        trainer.plot.follow(trainer.history)


def restore(trainer: PopulationTrainer, path: Path) -> None:
    """Take this worker's members and the bookkeeping from checkpoint `path`."""
    point = open_resume(trainer.ctx, path, trainer.task.train_size)
    state, meta = point.state, point.meta
    if "members" not in state:
        raise ShoalError(
            f"{path}: not a population_based checkpoint (strategy {meta.get('strategy')}); "
            "resume it with its own strategy"
        )
    if len(state["members"]) != trainer.size:
        raise ShoalError(
            f"strategy.population_size: the checkpoint {path} holds "
            f"{len(state['members'])} members, the config asks for {trainer.size}; "
            "resume with the same population size"
        )
    book = json.loads(state["population"])
    trainer.next_generation = book["next_generation"]
    trainer.hyper = book["hyperparameters"]
    trainer.parents = book["parents"]
    trainer.history = [Generation.from_json(g) for g in book["history"]]
    trainer.failures = book["failures"]
    trainer.replaced = book["replaced"]
    trainer.samples = book["samples"]
    trainer.times = book["times"]
    for m, member in trainer.members.items():
        point.check_model(member.model, state["members"][m]["model"])
        member.load_state_dict(state["members"][m])
        member.set_hyperparameters(trainer.hyper[m])
    trainer.last_checkpoint = path
    if trainer.ctx.heartbeat is not None:  # failure messages name the resumed step, not -1
        trainer.ctx.heartbeat.beat(trainer.history[-1].end if trainer.history else 0, now=True)
    trainer.ctx.log.info("resumed from %s at generation %d", path, trainer.next_generation)
