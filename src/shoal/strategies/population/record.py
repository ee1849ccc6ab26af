"""The model of record of a population: its best member, put on every rank for testing.

Each generation the driver selects on the best member's figures (the loop
measured them on `strategy.split`). When they are the best so far, the worker
that holds that member keeps a copy of its weights in memory. After training
the copy travels from that worker to every other (a state tree over the peer
layer, `comm/codec.py`) into a model built on each rank for the purpose, so the
test splits are evaluated collectively, as under every strategy, and the task
exports its artifacts from it. A resumed run whose best came before it reads
the member's weights from `best/`, which holds the whole population and, in
the book, which member was best.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from shoal.checkpoint.integrity import load_checkpoint
from shoal.comm.codec import recv_tree, send_tree
from shoal.comm.links import CommGroup
from shoal.runtime.context import WorkerContext
from shoal.shape.roles import RankRoles
from shoal.strategies.population.lineage import Generation
from shoal.strategies.population.member import Member
from shoal.strategies.population.operators import fitness


def best_member(generation: Generation, mode: str) -> int:
    """The generation's best member by fitness (the lowest index among equals; member 0
    when every member failed)."""
    fit = fitness([r.score for r in generation.members], mode)
    good = [m for m in range(len(fit)) if not math.isnan(fit[m])]
    return max(good, key=lambda m: (fit[m], -m)) if good else 0


class BestMember:
    """The best member's weights, the same on every rank once `restore_best` ran."""

    def __init__(
        self,
        ctx: WorkerContext,
        peers: CommGroup,
        roles: RankRoles,
        model: nn.Module,
        members: dict[int, Member],
    ) -> None:
        self.ctx, self.peers, self.roles = ctx, peers, roles
        self._model, self.members = model, members
        self.current = 0  # the best member of the latest generation (set by the loop)
        self.kept: int | None = None  # the member whose weights were kept as the best
        self.best: dict[str, torch.Tensor] | None = None  # on the rank that holds it

    @property
    def model(self) -> nn.Module:
        return self._model

    def validated(self, best: bool) -> None:
        """Collective in effect (every rank takes the same decision): the owner copies."""
        if not best:
            return
        self.kept = self.current
        if self.roles.owner(self.current) == self.ctx.rank:
            state = self.members[self.current].model.state_dict()
            self.best = {k: t.detach().to("cpu", copy=True) for k, t in state.items()}

    def restore_best(self, saved: Path | None) -> bool:
        if self.kept is None and saved is not None:  # the best came before this session
            state, _ = load_checkpoint(saved)
            member = json.loads(state["population"])["best_member"]
            self._model.load_state_dict(state["members"][member]["model"])
            return True
        if self.kept is None:
            return False
        self.share(self.kept, self.best)
        return True

    def take_latest(self) -> None:
        """Collective: the latest generation's best member becomes the model (a run in which
        no validation selected one, e.g. every score was NaN)."""
        if self.kept is None:
            member = self.members.get(self.current)
            self.share(self.current, member.model.state_dict() if member else None)

    def share(self, member: int, state: dict[str, torch.Tensor] | None) -> None:
        """Collective: member `member`'s weights, held by its owner, into every rank's model."""
        owner, rank = self.roles.owner(member), self.ctx.rank
        what = f"the best member {member}'s weights for testing"
        if rank == owner:
            assert state is not None
            for peer in range(self.ctx.world_size):
                if peer != rank:
                    send_tree(self.peers, state, peer, what)
        else:
            state = recv_tree(self.peers, owner, what, self.ctx.device, f"member {member}'s host")
        self._model.load_state_dict(state)
