"""Meshes placed by host: which rank sits at each point of a model-parallel mesh.

torch's DeviceMesh takes the ranks in the order it is given: with `{ data = 2,
tensor = 2 }` in rank order the tensor groups are ranks {0, 1} and {2, 3}. That
keeps each tensor group on one machine only when the launcher numbers a host's
ranks consecutively (torchrun does, srun's block distribution does) and the
hosts hold whole groups; `srun --distribution=cyclic` puts ranks 0, 2 on one node
and 1, 3 on the other, and every tensor group would cross the network.

The dimensions differ in what they send: tensor parallelism all-reduces
activations in every block's forward and backward, a pipeline sends activations
between neighbouring stages, the data dimension exchanges gradients (or FSDP's
shards) once per block per step. So the inner dimensions go inside a host,
innermost first (tensor, then pipeline), and data across hosts: `mesh_order`
cuts each host's ranks (the hosts every rank reported at start,
`runtime/hosts.py`, the same ones hierarchical aggregation groups by) into whole
blocks of the inner dimensions, and only the ranks left over form blocks that
span hosts. Tensor groups that span hosts get a one-line warning, not a refusal:
the maths is the same, only slower, and a user may have no other hosts.

One rule comes from torch: a mesh dimension's process group numbers its members
in increasing rank order (`new_group` sorts them), while DTensor puts shard i at
mesh coordinate i. The two must agree or shards are silently assembled in the
wrong order (seen on torch 2.13: a data x tensor mesh [[0, 3], [1, 2]] gathers a
row-sharded tensor as rows 4..7, 0..3). So along every dimension the ranks must
increase with the coordinate (`keeps_rank_order`); a host-aligned order that
cannot (hosts {0, 3} and {1, 2}) is not used and the mesh keeps rank order.
Blocks are sorted by their first rank, which keeps rank 0 at the origin.
"""

from __future__ import annotations

import math
from typing import Any

#: dimensions placed inside a host where they fit, innermost first (data goes across)
INNER = ("tensor", "pipeline")
#: dimensions warned about when their groups span hosts: a tensor group all-reduces in
#: every block; a pipeline across hosts sends one activation per micro-batch to its
#: neighbour, which is what pipelines across machines are for (logged, not warned)
WARNED = ("tensor",)


def block_sizes(dims: dict[str, int]) -> list[int]:
    """Sizes of the nested blocks below the outermost dimension, largest first:
    {data 2, pipeline 2, tensor 2} -> [4, 2] (a pipeline x tensor block, a tensor group)."""
    sizes = list(dims.values())
    return [math.prod(sizes[i:]) for i in range(1, len(sizes)) if math.prod(sizes[i:]) > 1]


def mesh_order(hosts: list[list[int]], dims: dict[str, int]) -> list[int]:
    """The rank at each point of the mesh (row-major, outermost dimension first), with
    whole blocks of the inner dimensions inside a host wherever the hosts hold them, and
    rank order along every dimension; rank order itself when no such layout exists.
    `hosts`: each host's ranks, ascending."""
    identity = sorted(rank for ranks in hosts for rank in ranks)
    order = _pack([sorted(ranks) for ranks in hosts if ranks], block_sizes(dims))
    return order if keeps_rank_order(order, dims) else identity


def _pack(groups: list[list[int]], blocks: list[int]) -> list[int]:
    """Cut every group into whole blocks of `blocks[0]`; the ranks left over in each
    group are packed by the smaller blocks, then cut alike. Blocks in order of their
    first rank."""
    if not blocks:
        return sorted(rank for ranks in groups for rank in ranks)
    size = blocks[0]
    whole: list[list[int]] = []
    rest: list[list[int]] = []
    for ranks in groups:
        cut = len(ranks) - len(ranks) % size
        whole.extend(ranks[i : i + size] for i in range(0, cut, size))
        if ranks[cut:]:
            rest.append(ranks[cut:])
    mixed = _pack(rest, blocks[1:])
    whole.extend(mixed[i : i + size] for i in range(0, len(mixed), size))
    whole.sort(key=lambda block: block[0])
    return [rank for block in whole for rank in block]


def dimension_groups(
    order: list[int] | tuple[int, ...], dims: dict[str, int], name: str
) -> list[list[int]]:
    """The ranks of each group of dimension `name` (the points that differ only in it),
    in coordinate order; groups in the order of their first point."""
    names, sizes = list(dims), list(dims.values())
    axis = names.index(name)
    stride = math.prod(sizes[axis + 1 :])
    return [
        [order[start + k * stride] for k in range(sizes[axis])]
        for start in range(len(order))
        if (start // stride) % sizes[axis] == 0
    ]


def keeps_rank_order(order: list[int] | tuple[int, ...], dims: dict[str, int]) -> bool:
    """Along every dimension, ranks increase with the coordinate (see the module docstring)."""
    return all(
        group == sorted(group) for name in dims for group in dimension_groups(order, dims, name)
    )


def placement_report(
    order: tuple[int, ...],
    dims: dict[str, int],
    host_of: tuple[int, ...],
    names: tuple[str, ...],
    by_host: bool,
) -> tuple[str, list[str], dict[str, Any]]:
    """(the log line, a warning when tensor groups span hosts, the metrics.jsonl record)
    of a mesh whose point i holds rank `order[i]`."""
    groups = {name: dimension_groups(order, dims, name) for name in dims}

    def hosts_of(ranks: list[int]) -> list[str]:
        return [names[h] for h in sorted({host_of[r] for r in ranks})]

    parts = []
    for name in dims:
        listed = ", ".join(
            f"{','.join(map(str, g))} on {'+'.join(hosts_of(g))}" for g in groups[name]
        )
        parts.append(f"{name} groups {listed}")
    how = "by host" if by_host else "in rank order (strategy.place_by_host = false)"
    line = f"mesh placed {how}: " + "; ".join(parts)
    warnings = []
    per_host = ", ".join(
        f"{names[h]} {sum(1 for x in host_of if x == h)}" for h in range(len(names))
    )
    for name in (n for n in WARNED if n in dims):
        split = [g for g in groups[name] if len(hosts_of(g)) > 1]
        if not split:
            continue
        spanned = sorted({h for g in split for h in hosts_of(g)}, key=names.index)
        warnings.append(
            f"{name} groups span hosts ({len(split)} of {len(groups[name])} groups across "
            f"{', '.join(spanned)}; ranks per host: {per_host}): their traffic crosses the "
            f"network every block; {_remedy(name, dims, by_host, order, host_of)}"
        )
    record = {
        "event": "placement",
        "by_host": by_host,
        "mesh": dict(dims),
        "order": list(order),
        "hosts": {
            names[h]: [r for r, x in enumerate(host_of) if x == h] for h in range(len(names))
        },
        "groups": {
            name: [{"ranks": g, "hosts": hosts_of(g)} for g in gs] for name, gs in groups.items()
        },
        "spanning": [
            name
            for name in INNER
            if name in dims and any(len(hosts_of(g)) > 1 for g in groups[name])
        ],
    }
    return line, warnings, record


def _remedy(
    name: str, dims: dict[str, int], by_host: bool, order: tuple[int, ...], host_of: tuple[int, ...]
) -> str:
    if not by_host:
        return "set strategy.place_by_host = true"
    hosts = [[r for r, h in enumerate(host_of) if h == x] for x in sorted(set(host_of))]
    if _pack(hosts, block_sizes(dims)) != list(order):
        return (
            "number each host's ranks consecutively (torchrun does, srun --distribution=block): "
            "with these numbers no layout by host keeps every group in rank order, which "
            "torch's DeviceMesh needs"
        )
    return (
        f"make {name} at most the ranks of a host ({dims[name]} now), or start more ranks per host"
    )
