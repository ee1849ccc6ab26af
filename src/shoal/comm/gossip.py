"""Gossip: decentralized SGD, each rank averaging parameters with its neighbours only.

D-PSGD (Lian et al., 2017): rank i computes its gradient g_i at its own
parameters x_i and, meanwhile, exchanges x_i with its neighbours; then

    x_i <- sum_j w_ij x_j  -  lr * g_i

with w the topology's Metropolis-Hastings mixing matrix
(:mod:`shoal.comm.topology`). There is no global average: a rank talks to
deg(i) peers, not to all of them, and no rank waits for the slowest one far
away. Replicas differ; they stay close, and the *consensus distance*
sqrt(1/n sum_i ||x_i - mean(x)||^2) (Kong et al., 2021) says how close. It is
logged at every logging interval (that costs two all-reduces of the parameters,
then only).

The exchange of x_i starts before the forward pass, on a communication thread,
and is awaited in `finish()`: it overlaps the whole forward and backward. Each
rank steps with its own gradient times the world size: the trainer divides the
loss by the global batch, so that is the mean gradient over the rank's shard.
Floating-point buffers (batch-norm statistics) are mixed like parameters.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist
from torch import nn

from shoal.comm.links import CommGroup
from shoal.comm.threads import CommThread, Pending
from shoal.comm.topology import metropolis_hastings
from shoal.training.contracts import GradientSync
from shoal.training.nonfinite import agree_on_nonfinite, nonfinite_names


class _Flat:
    """The tensors of one dtype, flattened for sending, and a receive buffer per neighbour."""

    def __init__(self, tensors: list[torch.Tensor], neighbours: int) -> None:
        self.tensors = tensors
        total = sum(t.numel() for t in tensors)
        self.send = torch.empty(total, dtype=tensors[0].dtype, device=tensors[0].device)
        self.recv = [torch.empty_like(self.send) for _ in range(neighbours)]

    def gather(self) -> None:
        torch.cat([t.detach().reshape(-1) for t in self.tensors], out=self.send)

    def scatter(self) -> None:
        offset = 0
        for tensor in self.tensors:
            tensor.data.copy_(self.send[offset : offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()


class GossipSync(GradientSync):
    """Mixes parameters with neighbours each step; gradients stay local."""

    def __init__(self, model: nn.Module, links: CommGroup, adjacency: list[list[int]]) -> None:
        self.model = model
        self.links = links
        self.neighbours = adjacency[links.rank]
        self.weights = metropolis_hastings(adjacency)[links.rank]
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        tensors: list[torch.Tensor] = [p for _, p in self.named]
        tensors += [b for b in model.buffers() if b.is_floating_point() and b.numel()]
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for tensor in tensors:
            by_dtype.setdefault(tensor.dtype, []).append(tensor)
        self.flats = [_Flat(group, len(self.neighbours)) for group in by_dtype.values()]
        self._thread = CommThread("shoal-gossip", links.timeout_s)
        self._pending: Pending | None = None
        self._nonfinite: list[str] = []
        self._reported_bytes = 0

    def zero_grad(self) -> None:
        for _, param in self.named:
            param.grad = None
        self._nonfinite = []

    def begin_step(self) -> None:
        """Snapshot x_i and start exchanging it while forward and backward run."""
        for flat in self.flats:
            flat.gather()
        self._pending = self._thread.submit(self._exchange, "gossip exchange")

    def _exchange(self) -> None:
        for flat in self.flats:
            sends = [(peer, flat.send) for peer in self.neighbours]
            recvs = list(zip(self.neighbours, flat.recv, strict=True))
            self.links.exchange(sends, recvs, "gossip exchange")

    def finish(self) -> float:
        started = time.perf_counter()
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
        waited = time.perf_counter() - started
        with torch.no_grad():
            for flat in self.flats:  # x_i <- sum_j w_ij x_j
                flat.send.mul_(self.weights[self.links.rank])
                for peer, received in zip(self.neighbours, flat.recv, strict=True):
                    flat.send.add_(received, alpha=self.weights[peer])
                flat.scatter()
            grads = [(name, param.grad) for name, param in self.named]
            self._nonfinite = nonfinite_names(grads)
            factor = self.links.world_size / self.loss_scale
            for _, param in self.named:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                elif factor != 1.0:
                    param.grad.mul_(factor)
        return waited

    def nonfinite(self) -> dict[int, list[str]]:
        device = self.named[0][1].device if self.named else torch.device("cpu")
        return agree_on_nonfinite(self._nonfinite, device)

    def take_sent_bytes(self) -> int:
        sent = self.links.sent_bytes - self._reported_bytes
        self._reported_bytes = self.links.sent_bytes
        return sent

    def bytes_per_step(self) -> int:
        return sum(f.send.numel() * f.send.element_size() for f in self.flats)

    def consensus_distance(self) -> float:
        """Collective: sqrt(1/n sum_i ||x_i - mean(x)||^2) over the parameters, in float64."""
        params = [p.detach().reshape(-1).double() for _, p in self.named]
        x = torch.cat(params) if params else torch.zeros(0, dtype=torch.float64)
        n = self.links.world_size
        if n == 1:
            return 0.0
        mean = x.clone()
        dist.all_reduce(mean, group=self.links.group)
        mean /= n
        spread = (x - mean).square().sum().reshape(1)
        dist.all_reduce(spread, group=self.links.group)
        return math.sqrt(float(spread.item()) / n)

    def interval_metrics(self) -> dict[str, float]:
        return {"consensus_distance": self.consensus_distance()}

    def rank_state_dict(self) -> dict[str, torch.Tensor]:
        """Every replica's own parameters: each resumes from where it was, not from rank 0's."""
        state = {}
        for index, flat in enumerate(self.flats):
            flat.gather()
            state[f"replica.{index}"] = flat.send.clone()
        return state

    def load_rank_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for index, flat in enumerate(self.flats):
                flat.send.copy_(state[f"replica.{index}"])
                flat.scatter()
