"""`LocalSGDStrategy`: the strategy class shoal loads for `[strategy] type = "local_sgd"`.

It needs only shoal's public strategy contract: `config_class` (its config
model, which says how many processes: `workers_field`), `attach` (the gradient
sync of each replica) and `state_dict` / `load_state_dict` (every replica's
parameters, so a resume continues exactly, even between two averagings). The
job loop is shoal's shared trainer: checkpoints, evaluation, metrics and results
come with it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from shoal.extend import GradientSync, Strategy, gather_tensors
from shoal_local_sgd.averaging import ModelAveragingSync
from shoal_local_sgd.config import LocalSGDConfig


class LocalSGDStrategy(Strategy[LocalSGDConfig]):
    """Replicas train on their own shards and average their models every k steps."""

    config_class: ClassVar[type[LocalSGDConfig]] = LocalSGDConfig
    sync: ModelAveragingSync

    def attach(self, model: nn.Module) -> GradientSync:
        with torch.no_grad():  # every replica starts from rank 0's model
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor.data, src=0)
        self.sync = ModelAveragingSync(
            model, self.config.average_every, self.config.average_buffers
        )
        return self.sync

    def state_dict(self) -> dict[str, Any]:
        """Collective: every rank's replica; rank 0 returns them all."""
        ranks = gather_tensors(self.ctx, self.sync.rank_state_dict())
        return {"ranks": ranks} if self.ctx.is_main else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ranks = state.get("ranks") or []
        if len(ranks) == self.ctx.world_size:
            self.sync.load_rank_state_dict(ranks[self.ctx.rank])
        elif ranks:
            self.ctx.log.warning(
                "local_sgd: the checkpoint holds %d replicas, this job has %d workers: every "
                "replica starts from the saved (rank 0) model",
                len(ranks),
                self.ctx.world_size,
            )

    def describe(self) -> str:
        return f"local_sgd x{self.ctx.world_size} (average every {self.config.average_every})"
