"""The step's agreement summed over a mesh's dimensions in turn equals one over the world."""

from __future__ import annotations

import signal
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from shoal.runtime.stop import STOP
from shoal.training.nonfinite import agree_on_step
from tests.comm.group import run_in_group

CPU = torch.device("cpu")


def _agree_by_dimensions(rank: int, world_size: int) -> None:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pipeline", "tensor"))
    groups = [mesh["pipeline"].get_group(), mesh["tensor"].get_group()]
    # shares no two partial sums of which round alike: the order of the sums shows in the bits
    share = torch.tensor(0.1 * (rank + 1) ** 3 + 1e-9 * rank, dtype=torch.float64)
    found = ["blocks.0.attn.q.weight"] if rank == 2 else []
    STOP.reset()
    STOP.signum = int(signal.SIGTERM) if rank == 3 else 0

    by_dimensions = agree_on_step(found, CPU, share, groups)
    agreed_stop = STOP.take_agreed()
    at_once = agree_on_step(found, CPU, share)
    STOP.reset()

    assert by_dimensions.nonfinite == at_once.nonfinite == {2: ["blocks.0.attn.q.weight"]}
    assert agreed_stop == int(signal.SIGTERM)
    assert by_dimensions.norm is not None and at_once.norm is not None
    expected = sum(0.1 * (r + 1) ** 3 + 1e-9 * r for r in range(world_size)) ** 0.5
    assert abs(by_dimensions.norm - expected) <= 1e-12 * expected
    assert abs(by_dimensions.norm - at_once.norm) <= 1e-12 * expected
    # every rank clips by the same bits, or replicated parameters drift apart
    norms = [torch.zeros(1, dtype=torch.float64) for _ in range(world_size)]
    dist.all_gather(norms, torch.tensor([by_dimensions.norm], dtype=torch.float64))
    assert len({float(n) for n in norms}) == 1, norms


def test_agreement_over_mesh_dimensions_equals_one_over_the_world(tmp_path: Path) -> None:
    """A 2 x 2 mesh of 4 gloo processes: a NaN on rank 2 named, rank 3's SIGTERM agreed, the
    norm the square root of every rank's share, the same bits on every rank."""
    assert run_in_group(4, _agree_by_dimensions, tmp_path) == [0, 1, 2, 3]
