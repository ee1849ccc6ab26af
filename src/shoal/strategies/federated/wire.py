"""Every tensor the federated strategy hands to torch.distributed goes through here.

Two reasons. It counts the bytes this worker sends and receives (the "bytes up
and down" of each round), and with `strategy.audit_wire = true` it keeps a copy
of every payload, so that what left a worker can be inspected after the run: the
tests read these files to show that no training sample ever crossed the wire.
Only tensors cross; byte strings (public keys) travel as uint8 tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from shoal.runtime.context import WorkerContext


class Wire:
    """Counted (and optionally recorded) collectives over the job's process group."""

    def __init__(self, ctx: WorkerContext, audit: bool) -> None:
        self.ctx = ctx
        self.audit = audit
        self.active = ctx.distributed and ctx.world_size > 1
        self.sent_bytes = 0
        self.received_bytes = 0
        self.records: list[dict[str, Any]] = []

    def _record(self, what: str, direction: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if direction == "sent":
            self.sent_bytes += nbytes
        else:
            self.received_bytes += nbytes
        if self.audit:
            self.records.append(
                {"what": what, "direction": direction, "tensor": tensor.detach().cpu().clone()}
            )

    def all_reduce_sum(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """Sum `tensor` over all ranks, in place; with one rank nothing crosses."""
        if not self.active:
            return tensor
        self._record(what, "sent", tensor)
        on_device = tensor.to(self.ctx.comm_device)
        dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
        tensor.copy_(on_device)
        self._record(what, "received", tensor)
        return tensor

    def all_gather(self, tensor: torch.Tensor, what: str) -> list[torch.Tensor]:
        """Every rank's `tensor` (same shape on every rank), indexed by rank."""
        if not self.active:
            return [tensor]
        self._record(what, "sent", tensor)
        on_device = tensor.to(self.ctx.comm_device)
        gathered = [torch.zeros_like(on_device) for _ in range(self.ctx.world_size)]
        dist.all_gather(gathered, on_device)
        out = [g.cpu() for g in gathered]
        for rank, item in enumerate(out):
            if rank != self.ctx.rank:
                self._record(what, "received", item)
        return out

    def save(self, path: Path) -> None:
        """Write the recorded payloads (tensors and their labels only: loadable weights_only)."""
        torch.save(self.records, path)
