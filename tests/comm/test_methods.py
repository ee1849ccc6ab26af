"""Every aggregation method equals the exact mean: world sizes 1 to 5, awkward lengths, two dtypes.

The trainer scales each rank's gradient by 1 / global batch, so the methods'
sum is a mean; here each rank contributes x_r / n and must get mean(x_r). Every
rank must also hold bit-identical results, or replicas would drift apart.
Compressors at settings where they are lossless (top-k and random-k keeping
everything, PowerSGD on a gradient of rank 1) must give the mean too, over
every method: that is what "composable" means.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from pydantic import TypeAdapter

from shoal.comm.aggregators import BucketSpec
from shoal.comm.config import AggregationConfig
from shoal.comm.links import CommGroup
from shoal.comm.methods import AGGREGATORS, COMPRESSORS, build_aggregator
from shoal.shape.hosts import Hosts
from tests.comm.group import TIMEOUT_S, run_in_group

DTYPES = {torch.float32: (1e-5, 1e-6), torch.bfloat16: (2e-2, 2e-2)}


def method_variants(world_size: int) -> list[dict[str, Any]]:
    """Every registered exact method, with the settings that change its communication pattern."""
    variants: list[dict[str, Any]] = []
    for method in AGGREGATORS:
        if method == "hierarchical":
            variants += [{"method": method, "branching_factor": b} for b in (1, 2, 3)]
            variants.append({"method": method})  # default: one group per host
        elif method == "parameter_server":
            servers = sorted({1, max(1, world_size // 2), world_size})
            variants += [{"method": method, "num_servers": s} for s in servers]
        else:
            variants.append({"method": method})
    return variants


# half-precision sums round; a power iteration's normalizations round in float32
TOLERANCES = {"fp16": (1e-2, 1e-2), "bf16": (1e-2, 1e-2), "powersgd": (1e-4, 1e-5)}
COMPRESSIONS = [
    {"kind": "topk", "ratio": 1.0},
    {"kind": "topk", "ratio": 1.0, "error_feedback": False},
    {"kind": "randomk", "ratio": 1.0},
    {"kind": "powersgd", "rank": 1},
    {"kind": "fp16"},
    {"kind": "bf16"},
]


def lengths(world_size: int) -> list[int]:
    """0, 1, n - 1, and lengths n does not divide (for n > 1), short and long."""
    n = world_size
    return sorted({0, 1, max(n - 1, 0), n + 1, 2 * n + 3, 4099})


def _contribution(rank: int, length: int, salt: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * salt + 17 * rank + length)
    return torch.rand(length, generator=generator, dtype=torch.float64) * 2 - 1


def _rank_one(rank: int, rows: int, cols: int, salt: int) -> torch.Tensor:
    """Matrices whose sum over ranks has rank 1: c_r * a b^T with a, b shared by all ranks."""
    shared = torch.Generator().manual_seed(salt)
    a = torch.rand(rows, generator=shared, dtype=torch.float64) + 0.5
    b = torch.rand(cols, generator=shared, dtype=torch.float64) - 0.5
    return (rank + 1.0) * torch.outer(a, b)


def _check(
    rank: int,
    world_size: int,
    label: str,
    inputs: list[torch.Tensor],
    result: torch.Tensor,
    tolerance: tuple[float, float],
    failures: list[str],
) -> None:
    expected = torch.stack(inputs).mean(dim=0) if inputs[0].numel() else inputs[0]
    rtol, atol = tolerance
    if not torch.allclose(result.double(), expected, rtol=rtol, atol=atol):
        error = (result.double() - expected).abs().max().item()
        failures.append(f"{label}: rank {rank}: max error {error:.3g}")
    copies = [torch.empty_like(result) for _ in range(world_size)]
    dist.all_gather(copies, result)
    if not all(torch.equal(copy, result) for copy in copies):
        failures.append(f"{label}: ranks hold different results")


def _exact_methods(rank: int, world_size: int) -> None:
    failures: list[str] = []
    adapter = TypeAdapter(AggregationConfig)
    # one private group serves every variant in turn; hierarchical's default groups by host, here
    # two hosts whose ranks are not consecutive (even ranks on one, odd on the other)
    hosts = Hosts.from_ranks([(f"host{r % 2}", f"10.0.0.{r % 2}") for r in range(world_size)])
    links = CommGroup.create(rank, world_size, hosts, TIMEOUT_S)
    for variant in method_variants(world_size):
        aggregator = build_aggregator(adapter.validate_python(variant), links)
        for dtype, tolerance in DTYPES.items():
            for length in lengths(world_size):
                inputs = [_contribution(r, length, 1) for r in range(world_size)]
                bucket = (inputs[rank] / world_size).to(dtype)
                aggregator.start(bucket).wait()
                label = f"{variant} {dtype} length {length}"
                rounded = [x.to(dtype).double() for x in inputs]
                _check(rank, world_size, label, rounded, bucket, tolerance, failures)
    for method in AGGREGATORS:
        for compression in COMPRESSIONS:
            variant = {"method": method, "compression": compression}
            aggregator = build_aggregator(adapter.validate_python(variant), links)
            tolerance = TOLERANCES.get(compression["kind"], (1e-5, 1e-6))
            for index, length in enumerate(sorted({0, 1, 2 * world_size + 3, 37, 4099})):
                rows = 4 if length >= 8 else 0
                cols = (length - 1) // 4 if rows else 0
                inputs = [_contribution(r, length, 2) for r in range(world_size)]
                if rows:  # a rank-one matrix, then a vector: the layout PowerSGD sees
                    for r in range(world_size):
                        inputs[r][: rows * cols] = _rank_one(r, rows, cols, length).reshape(-1)
                bucket = (inputs[rank] / world_size).float()
                shapes = ((rows, cols), (length - rows * cols,)) if rows else ((length,),)
                aggregator.bind([BucketSpec(index, bucket, ("matrix", "vector"), shapes)])
                aggregator.start(bucket).wait()
                label = f"{variant} length {length}"
                _check(rank, world_size, label, inputs, bucket, tolerance, failures)
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_every_method_equals_the_exact_mean(tmp_path: Path, world_size: int) -> None:
    assert run_in_group(world_size, _exact_methods, tmp_path) == list(range(world_size))


def test_the_families_are_covered() -> None:
    """New methods and compressors join the tests above through their registries."""
    assert set(AGGREGATORS) == {"native", "ring", "tree", "hierarchical", "parameter_server"}
    assert {c["kind"] for c in COMPRESSIONS} == set(COMPRESSORS)
