"""A small synthetic knowledge graph with planted structure, written as TSV files.

Entities fall into clusters. Each relation r has a source cluster a_r and a
target cluster b_r (a_r != b_r); every entity of a_r is linked by r to `links`
random entities of b_r. Every one of the four models can express this (TransE:
r translates cluster a_r onto b_r; DistMult: r weighs the dimensions that mark
both clusters), and a model that learns it ranks the target cluster first, so
its filtered MRR lands far above that of a random ranking.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_planted_graph(
    folder: Path,
    clusters: int = 8,
    per_cluster: int = 8,
    relations: int = 8,
    links: int = 4,
    seed: int = 0,
) -> dict[str, Path]:
    rng = np.random.default_rng(seed)
    triples = set()
    for r in range(relations):
        source, target = rng.choice(clusters, size=2, replace=False)
        for i in range(per_cluster):
            head = int(source) * per_cluster + i
            for j in rng.choice(per_cluster, size=links, replace=False):
                triples.add((head, r, int(target) * per_cluster + int(j)))
    rows = sorted(triples)
    order = rng.permutation(len(rows))
    held = max(1, len(rows) // 10)
    parts = {
        "valid": [rows[i] for i in order[:held]],
        "test": [rows[i] for i in order[held : 2 * held]],
        "train": [rows[i] for i in order[2 * held :]],
    }
    paths = {}
    for name, part in parts.items():
        path = folder / f"{name}.txt"
        path.write_text("".join(f"e{h}\trel{r}\te{t}\n" for h, r, t in part))
        paths[name] = path
    return paths


def random_mrr(num_entities: int) -> float:
    """The MRR of ranking uniformly at random among `num_entities` candidates."""
    return float(np.mean(1.0 / np.arange(1, num_entities + 1)))
