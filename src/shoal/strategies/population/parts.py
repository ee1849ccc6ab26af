"""A population's checkpoint parts: every member's state, gathered on rank 0, and the book.

The book (generation, hyperparameters, parents, history, totals, the best member)
is the same on every rank and is saved as JSON under `population`; each
member's state (model, optimizer, schedule, data position, generators) comes
from the worker that holds it, as tensors, under `members`. The driver writes
them with its own parts (`training/driver.py`); on resume every rank reads the
checkpoint and takes its own members, so a resume may use another number of
workers.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from shoal.comm.codec import recv_tree, send_tree
from shoal.errors import ShoalError
from shoal.strategies.population.lineage import Generation

if TYPE_CHECKING:
    from shoal.strategies.population.loop import PopulationLoop


class Book:
    """The population's bookkeeping (the `population` part), loaded before the members."""

    def __init__(self, loop: PopulationLoop) -> None:
        self.loop = loop

    def state_dict(self) -> str:
        loop = self.loop
        return json.dumps(
            {
                "next_generation": loop.next_generation,
                "hyperparameters": loop.hyper,
                "parents": loop.parents,
                "history": [g.to_json() for g in loop.history],
                "failures": loop.failures,
                "replaced": loop.replaced,
                "samples": loop.samples,
                "times": loop.times,
                "best_member": loop.record.current,
            }
        )

    def load_state_dict(self, state: str) -> None:
        loop, book = self.loop, json.loads(state)
        loop.next_generation = book["next_generation"]
        loop.hyper = book["hyperparameters"]
        loop.parents = book["parents"]
        loop.history = [Generation.from_json(g) for g in book["history"]]
        loop.failures = book["failures"]
        loop.replaced = book["replaced"]
        loop.samples = book["samples"]
        loop.times = book["times"]
        loop.record.current = book.get("best_member", 0)


class Members:
    """Every member's state (the `members` part): collective to save, each rank loads its own."""

    def __init__(self, loop: PopulationLoop) -> None:
        self.loop = loop

    def state_dict(self) -> list[Any]:
        """Collective: every member's state, in member order, on rank 0 (empty elsewhere)."""
        loop, ctx = self.loop, self.loop.ctx
        started = time.perf_counter()
        states: list[Any] = []
        for m in range(loop.size):
            src = loop.roles.owner(m)
            what = f"member {m}'s state for the checkpoint"
            if ctx.is_main:
                states.append(
                    loop.members[m].state_dict()
                    if src == 0
                    else recv_tree(loop.peers, src, what, ctx.device, f"member {m}'s host")
                )
            elif src == ctx.rank:
                send_tree(loop.peers, loop.members[m].state_dict(), 0, what)
        loop.times["checkpoint"] += time.perf_counter() - started
        return states

    def load_state_dict(self, states: list[Any]) -> None:
        """This worker's members, after the book (their hyperparameters are in it)."""
        loop = self.loop
        resume = loop.run.resume
        assert resume is not None
        if len(states) != loop.size:
            raise ShoalError(
                f"strategy.population_size: the checkpoint {resume.path} holds "
                f"{len(states)} members, the config asks for {loop.size}; "
                "resume with the same population size"
            )
        for m, member in loop.members.items():
            resume.check_model(member.model, states[m]["model"])
            member.load_state_dict(states[m])
            member.set_hyperparameters(loop.hyper[m])
