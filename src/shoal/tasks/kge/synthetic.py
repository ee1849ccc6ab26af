"""Synthetic knowledge graphs of any size: power-law degrees, structure a model can learn.

Entities fall into `clusters` (entity e is member e // clusters of cluster
e % clusters). Each relation r links a source cluster a_r to a target cluster
b_r != a_r; a triple of r joins a member of a_r to a member of b_r, each drawn with
probability proportional to (member index + 1)^-exponent, so a few entities of
every cluster are hubs and most are rare (power-law degrees, as in Freebase or
Wikidata). Relations are drawn with the same law, so some are frequent and most are
rare. Every model shoal trains can express the structure (TransE: r translates a_r
onto b_r; DistMult: r weighs the dimensions that mark both clusters), and ranking
b_r's hubs first beats a random ranking by far: the planted structure of the tests'
`planted.py`, at any scale.

Triple i is a function of (seed, i) alone (counter-based draws, `sampling.counter_uniform`),
so a graph is generated a block at a time, in bounded memory, identically whatever
the block size. Held-out triples are chosen the same way (a share `held_out` each for
valid and test). Repeated triples are kept, as in real dumps; the filter index
counts each once.

Names are zero-padded (`e0000042`, `r013`), so their sorted order is the id order: a
graph written as TSV and prepared again gets the very ids written directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shoal.tasks.kge.prepared.names import write_names
from shoal.tasks.kge.prepared.progress import PrepareProgress
from shoal.tasks.kge.prepared.writer import FILTER_BUDGET, SPLITS, GraphWriter
from shoal.tasks.kge.sampling import counter_uniform

_STREAM_TRIPLE = 0x5EED
_STREAM_CLUSTERS = 0xC1A5
BLOCK = 1 << 20
NAME_BLOCK = 1 << 16


@dataclass(frozen=True)
class SyntheticGraph:
    """The recipe of a synthetic graph; `blocks()` yields its triples."""

    entities: int
    relations: int
    triples: int
    clusters: int = 64
    exponent: float = 1.1
    held_out: float = 0.01
    seed: int = 0

    def __post_init__(self) -> None:
        if self.clusters < 2 or self.entities < self.clusters:
            raise ValueError(
                f"{self.entities} entities in {self.clusters} clusters: need at least 2 "
                "clusters and an entity in each"
            )
        if self.relations < 1 or self.triples < 1 or not 0 <= self.held_out < 0.5:
            raise ValueError("need relations >= 1, triples >= 1 and 0 <= held_out < 0.5")

    def relation_clusters(self) -> tuple[np.ndarray, np.ndarray]:
        """Each relation's source and target cluster (different)."""
        u = counter_uniform(self.seed, _STREAM_CLUSTERS, 0, np.arange(self.relations), 2)
        source = (u[:, 0] * self.clusters).astype(np.int64)
        step = 1 + (u[:, 1] * (self.clusters - 1)).astype(np.int64)
        return source, (source + step) % self.clusters

    def _members(self, cluster: np.ndarray) -> np.ndarray:
        """How many entities each cluster has (the first `entities % clusters` one more)."""
        return self.entities // self.clusters + (cluster < self.entities % self.clusters)

    def _power_law(self, u: np.ndarray, n: np.ndarray | int) -> np.ndarray:
        """Index in [0, n) with P(j) ~ (j + 1)^-exponent (inverse CDF of the continuous law)."""
        s = self.exponent
        n = np.asarray(n, dtype=np.float64)
        if abs(s - 1.0) < 1e-9:
            x = np.power(n + 1.0, u)
        else:
            x = np.power((np.power(n + 1.0, 1.0 - s) - 1.0) * u + 1.0, 1.0 / (1.0 - s))
        return np.minimum(np.floor(x).astype(np.int64) - 1, n.astype(np.int64) - 1)

    def block(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Triples start..stop-1 as (n, 3) ids, and the split of each (0 train, 1 valid, 2 test)."""
        index = np.arange(start, stop, dtype=np.int64)
        u = counter_uniform(self.seed, _STREAM_TRIPLE, 0, index, 4)
        relation = self._power_law(u[:, 0], self.relations)
        source, target = self.relation_clusters()
        a, b = source[relation], target[relation]
        head = a + self.clusters * self._power_law(u[:, 1], self._members(a))
        tail = b + self.clusters * self._power_law(u[:, 2], self._members(b))
        split = np.where(u[:, 3] < self.held_out, 1, np.where(u[:, 3] < 2 * self.held_out, 2, 0))
        return np.stack([head, relation, tail], axis=1), split

    def blocks(self, rows: int = BLOCK) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for start in range(0, self.triples, rows):
            yield self.block(start, min(start + rows, self.triples))

    def entity_names(self) -> Iterator[list[str]]:
        yield from _names("e", self.entities)

    def relation_names(self) -> Iterator[list[str]]:
        yield from _names("r", self.relations)

    def describe(self) -> dict[str, Any]:
        return {
            "entities": self.entities,
            "relations": self.relations,
            "triples": self.triples,
            "clusters": self.clusters,
            "exponent": self.exponent,
            "held_out": self.held_out,
            "seed": self.seed,
        }


def _width(count: int) -> int:
    return len(str(max(count - 1, 0)))


def _names(prefix: str, count: int) -> Iterator[list[str]]:
    width = _width(count)
    for start in range(0, count, NAME_BLOCK):
        yield [f"{prefix}{i:0{width}d}" for i in range(start, min(start + NAME_BLOCK, count))]


def write_prepared(
    graph: SyntheticGraph,
    folder: Path,
    progress: PrepareProgress | None = None,
    budget: int = FILTER_BUDGET,
) -> dict[str, Any]:
    """Write `graph` as a prepared folder directly (no text in between); the manifest."""
    progress = progress or PrepareProgress()
    writer = GraphWriter(folder, progress, budget)
    outputs = [writer.split(name) for name in SPLITS]
    try:
        progress.phase("generating triples", graph.triples)
        done = 0
        for triples, split in graph.blocks():
            for index, out in enumerate(outputs):
                out.append(triples[split == index])
            done += len(triples)
            progress.advance_to(done)
    finally:
        for out in outputs:
            out.close()
    write_names(folder, "entity", graph.entity_names())
    write_names(folder, "relation", graph.relation_names())
    for name in SPLITS:
        writer.describe_split(name, f"synthetic {name}")
    return writer.finish(
        graph.entities, graph.relations, "synthetic", {"synthetic": graph.describe()}
    )


def _digits(values: np.ndarray, width: int) -> np.ndarray:
    """(n, width) ASCII digits of non-negative `values`, zero-padded."""
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return (values[:, None] // powers % 10 + ord("0")).astype(np.uint8)


def tsv_lines(graph: SyntheticGraph, triples: np.ndarray) -> bytes:
    """`e..<TAB>r..<TAB>e..` lines of `triples`, built as one fixed-width byte matrix."""
    width_e, width_r = _width(graph.entities), _width(graph.relations)
    n = len(triples)
    parts = [
        np.full((n, 1), ord("e"), np.uint8),
        _digits(triples[:, 0], width_e),
        np.full((n, 1), 9, np.uint8),
        np.full((n, 1), ord("r"), np.uint8),
        _digits(triples[:, 1], width_r),
        np.full((n, 1), 9, np.uint8),
        np.full((n, 1), ord("e"), np.uint8),
        _digits(triples[:, 2], width_e),
        np.full((n, 1), 10, np.uint8),
    ]
    return np.concatenate(parts, axis=1).tobytes()


def write_tsv(graph: SyntheticGraph, folder: Path) -> dict[str, Path]:
    """Write `graph` as train.txt, valid.txt and test.txt in `folder`; their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"{name}.txt" for name in SPLITS}
    handles = [open(paths[name], "wb") for name in SPLITS]  # noqa: SIM115 - closed below
    try:
        for triples, split in graph.blocks():
            for index, handle in enumerate(handles):
                handle.write(tsv_lines(graph, triples[split == index]))
    finally:
        for handle in handles:
            handle.close()
    return paths
