"""Writing a prepared graph into a folder: the splits, then everything derived from them.

A source (TSV files, id files, the synthetic generator) writes each split's triples as
int64 ids through `split()`, and the names through `names.write_names`; `finish()`
then reads the splits back from their memory maps, a block at a time, and writes
the training degrees, the per-relation counts, the filter index and the manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from shoal.tasks.kge.prepared.filter_build import build_filter
from shoal.tasks.kge.prepared.manifest import MANIFEST, VERIFIED, describe_files, write_manifest
from shoal.tasks.kge.prepared.npy import NpyWriter, open_npy, row_blocks, save_npy
from shoal.tasks.kge.prepared.progress import PrepareProgress

SPLITS = ("train", "valid", "test")
CHUNK_ROWS = 1 << 20
#: entries the filter index sorts in memory at once (three arrays of 8 bytes, and sorting's
#: own copies: about 200 MB)
FILTER_BUDGET = 1 << 23
DEGREE = "entity_degree.npy"  # (entities, 2): as head, as tail, in training (repeats counted)
RELATION_COUNTS = "relation_counts.npy"  # (relations, 3): triples, distinct heads, distinct tails


def split_file(name: str) -> str:
    return f"{name}.npy"


class GraphWriter:
    """Writes one prepared graph into `folder` (created, and expected empty)."""

    def __init__(
        self, folder: Path, progress: PrepareProgress, budget: int = FILTER_BUDGET
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.progress = progress
        self.budget = budget
        self.splits: dict[str, dict[str, Any]] = {}

    def split(self, name: str) -> NpyWriter:
        """Where split `name`'s triples (rows of head, relation, tail ids) are appended."""
        return NpyWriter(self.folder / split_file(name), np.int64, (3,))

    def describe_split(
        self, name: str, source: str, unseen: int = 0, first_unseen: str | None = None
    ) -> None:
        """Record where a split came from, and its held-out triples left out (`unseen`; the
        first one's `file:line: what`)."""
        self.splits[name] = {"source": source, "unseen": unseen, "first_unseen": first_unseen}

    def finish(
        self, num_entities: int, num_relations: int, input_kind: str, sources: dict[str, Any]
    ) -> dict[str, Any]:
        """Degrees, relation counts, filter index and manifest; returns the manifest."""
        splits = {name: open_npy(self.folder / split_file(name)) for name in self.splits}
        self.progress.phase("counting degrees")
        degree = np.zeros((num_entities, 2), dtype=np.int64)
        relation_counts = np.zeros((num_relations, 3), dtype=np.int64)
        train = splits["train"]
        for rows in row_blocks(train, CHUNK_ROWS):
            block = train[rows]
            degree[:, 0] += np.bincount(block[:, 0], minlength=num_entities)
            degree[:, 1] += np.bincount(block[:, 2], minlength=num_entities)
            relation_counts[:, 0] += np.bincount(block[:, 1], minlength=num_relations)
        self.progress.phase("building the filter index")
        distinct = build_filter(
            self.folder,
            [(splits[name], name == "train") for name in SPLITS if name in splits],
            num_entities,
            num_relations,
            self.budget,
            lambda: self.progress.advance_to(0),
        )
        relation_counts[:, 1] = distinct["tails"]  # distinct (head, relation): heads per relation
        relation_counts[:, 2] = distinct["heads"]  # distinct (tail, relation): tails per relation
        save_npy(self.folder / DEGREE, degree)
        save_npy(self.folder / RELATION_COUNTS, relation_counts)
        del splits, train
        self.progress.phase("checksums")
        names = [
            path.name
            for path in self.folder.iterdir()
            if path.name not in (MANIFEST, VERIFIED) and not path.name.startswith(".")
        ]
        body = {
            "entities": num_entities,
            "relations": num_relations,
            "input": input_kind,
            "splits": {
                name: {"triples": int(self._rows(name)), **info}
                for name, info in self.splits.items()
            },
            "sources": sources,
            "files": describe_files(self.folder, names),
        }
        return write_manifest(self.folder, body)

    def _rows(self, name: str) -> int:
        return len(open_npy(self.folder / split_file(name)))
