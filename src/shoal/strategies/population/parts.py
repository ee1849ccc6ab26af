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
from dataclasses import dataclass, field
from typing import Any

from shoal.comm.codec import recv_tree, send_tree
from shoal.comm.links import CommGroup
from shoal.errors import ShoalError
from shoal.runtime.context import WorkerContext
from shoal.shape.roles import RankRoles
from shoal.strategies.population.lineage import Generation
from shoal.strategies.population.member import Member
from shoal.strategies.population.record import BestMember
from shoal.strategies.population.space import Hyperparameters
from shoal.training.loop import Run


def _no_time() -> dict[str, float]:
    return {"compute": 0.0, "evaluation": 0.0, "communication": 0.0, "checkpoint": 0.0}


@dataclass
class PopulationBook:
    """The population's bookkeeping, the same on every rank: what the loop has done so far.

    `times` (seconds): training steps and evaluation summed over all members (every
    worker's); exchanges (results, exploit copies) and checkpoint gathers as this worker
    spent them.
    """

    hyper: list[Hyperparameters]
    parents: list[int | None] = field(default_factory=list)
    history: list[Generation] = field(default_factory=list)
    failures: int = 0
    replaced: int = 0
    samples: int = 0
    next_generation: int = 0
    times: dict[str, float] = field(default_factory=_no_time)

    def __post_init__(self) -> None:
        if not self.parents:
            self.parents = [None] * len(self.hyper)


class BookPart:
    """The `population` part: the book and the best member, loaded before the members."""

    def __init__(self, book: PopulationBook, record: BestMember) -> None:
        self.book, self.record = book, record

    def state_dict(self) -> str:
        book = self.book
        return json.dumps(
            {
                "next_generation": book.next_generation,
                "hyperparameters": book.hyper,
                "parents": book.parents,
                "history": [g.to_json() for g in book.history],
                "failures": book.failures,
                "replaced": book.replaced,
                "samples": book.samples,
                "times": book.times,
                "best_member": self.record.current,
            }
        )

    def load_state_dict(self, state: str) -> None:
        book, saved = self.book, json.loads(state)
        book.next_generation = saved["next_generation"]
        book.hyper = saved["hyperparameters"]
        book.parents = saved["parents"]
        book.history = [Generation.from_json(g) for g in saved["history"]]
        book.failures = saved["failures"]
        book.replaced = saved["replaced"]
        book.samples = saved["samples"]
        book.times = saved["times"]
        self.record.current = saved.get("best_member", 0)


class Members:
    """Every member's state (the `members` part): collective to save, each rank loads its own.

    `members`: this worker's (by member index); `roles` says which rank holds each; their
    states travel to rank 0 over `peers`.
    """

    def __init__(
        self,
        ctx: WorkerContext,
        peers: CommGroup,
        roles: RankRoles,
        members: dict[int, Member],
        book: PopulationBook,
        run: Run,
    ) -> None:
        self.ctx, self.peers, self.roles = ctx, peers, roles
        self.members, self.book, self.run = members, book, run

    def state_dict(self) -> list[Any]:
        """Collective: every member's state, in member order, on rank 0 (empty elsewhere)."""
        ctx = self.ctx
        started = time.perf_counter()
        states: list[Any] = []
        for m in range(len(self.book.hyper)):
            src = self.roles.owner(m)
            what = f"member {m}'s state for the checkpoint"
            if ctx.is_main:
                states.append(
                    self.members[m].state_dict()
                    if src == 0
                    else recv_tree(self.peers, src, what, ctx.device, f"member {m}'s host")
                )
            elif src == ctx.rank:
                send_tree(self.peers, self.members[m].state_dict(), 0, what)
        self.book.times["checkpoint"] += time.perf_counter() - started
        return states

    def load_state_dict(self, states: list[Any]) -> None:
        """This worker's members, after the book (their hyperparameters are in it)."""
        resume, size = self.run.resume, len(self.book.hyper)
        assert resume is not None
        if len(states) != size:
            raise ShoalError(
                f"strategy.population_size: the checkpoint {resume.path} holds "
                f"{len(states)} members, the config asks for {size}; "
                "resume with the same population size"
            )
        for m, member in self.members.items():
            resume.check_model(member.model, states[m]["model"])
            member.load_state_dict(states[m])
            member.set_hyperparameters(self.book.hyper[m])
