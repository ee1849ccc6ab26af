"""Hierarchical all-reduce cut into pieces: the pipelined path equals the exact mean.

A bucket crosses the hosts in pieces (reduced inside the host on the aggregator's
thread, rung among the leaders on a thread of their own, then broadcast): with
pieces of a few elements, a bucket of thousands of elements takes hundreds of
them, and every rank must still end with the exact mean, bit-identical across ranks,
for hosts of unequal sizes and for hosts whose ranks are not consecutive.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from shoal.comm.hierarchical import HierarchicalAllReduce
from shoal.comm.links import CommGroup
from shoal.shape.hosts import Hosts
from tests.comm.group import TIMEOUT_S, run_in_group

LAYOUTS = {
    "3 + 2, consecutive": ["a", "a", "a", "b", "b"],
    "2 + 2, interleaved": ["a", "b", "a", "b"],
    "2 + 1 + 2": ["a", "a", "b", "c", "c"],
}


def _pieces(rank: int, world_size: int, layout: str) -> None:
    names = LAYOUTS[layout]
    hosts = Hosts.from_ranks([(name, f"10.0.0.{ord(name)}") for name in names])
    links = CommGroup.create(rank, world_size, hosts, TIMEOUT_S)
    aggregator = HierarchicalAllReduce(links, piece_bytes=16)  # 4 floats a piece
    for dtype, (rtol, atol) in {torch.float32: (1e-5, 1e-6), torch.float64: (1e-12, 1e-12)}.items():
        for length in (1, 3, 4, 5, 203):  # up to 51 pieces of float32, 102 of float64
            inputs = [
                torch.rand(
                    length,
                    generator=torch.Generator().manual_seed(31 * r + length),
                    dtype=torch.float64,
                )
                for r in range(world_size)
            ]
            bucket = (inputs[rank] / world_size).to(dtype)
            for _ in range(2):  # the leader thread and the scratch serve the next bucket too
                aggregator.start(bucket).wait()
                expected = torch.stack(inputs).to(dtype).mean(dim=0)
                torch.testing.assert_close(bucket, expected, rtol=rtol, atol=atol)
                copies = [torch.empty_like(bucket) for _ in range(world_size)]
                dist.all_gather(copies, bucket)
                assert all(torch.equal(copy, bucket) for copy in copies), (layout, length)
                bucket = (inputs[rank] / world_size).to(dtype)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_pieces_equal_the_exact_mean(tmp_path: Path, layout: str) -> None:
    world_size = len(LAYOUTS[layout])
    assert run_in_group(world_size, _pieces, tmp_path, layout) == list(range(world_size))
