"""Knowledge-graph data as training reads it: a prepared graph, memory-mapped.

The triples come from a prepared folder (`[task.data] prepared = "folder"`, written
by `shoal kge prepare`), or from TSV files (`head<TAB>relation<TAB>tail` a line),
which are prepared into a cache beside them on first use (`prepared/cache.py`); a
built-in dataset is TSV files inside the pykeen wheel. Either way every process
maps the same files: triples, names, degrees and the filter index are read from the
page cache as they are used, never held as Python objects.

TSV files: CRLF endings are tolerated (FB15k-237 ships with them: a loader that keeps
the `\\r` counts 27,395 "entities" instead of 14,541), blank lines are skipped; gzip,
a byte-order mark and bytes that are not text are handled as for every text input
(`shoal/textfile.py`). A malformed line stops the run before training with
`file:line: what is wrong`. Entity and relation ids follow the sorted order of the
labels seen in training.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from shoal.errors import DataError, ShoalError
from shoal.tasks.kge.config import BuiltinDataConfig, FilesDataConfig, PreparedDataConfig
from shoal.tasks.kge.prepared.cache import cache_folder, prepared_for
from shoal.tasks.kge.prepared.filter_index import GraphFilter
from shoal.tasks.kge.prepared.graph import PreparedGraph
from shoal.tasks.kge.prepared.manifest import read_manifest
from shoal.tasks.kge.prepared.parse import TRIPLE_LINES, TRIPLES, raise_first_problem, split_block
from shoal.tasks.kge.prepared.progress import PrepareProgress
from shoal.tasks.kge.sampling import TrainStats
from shoal.textfile import text_blocks

__all__ = ["TRIPLE_LINES", "KGData", "LabelTriples", "load_kg", "read_triples"]

KGDataConfig = BuiltinDataConfig | FilesDataConfig | PreparedDataConfig


@dataclass
class LabelTriples:
    """The triples of one file as labels, with the line each came from."""

    path: Path
    heads: list[str]
    relations: list[str]
    tails: list[str]
    lines: np.ndarray

    def __len__(self) -> int:
        return len(self.heads)


def read_triples(path: Path) -> LabelTriples:
    """The labels of a triples file, read as preparation reads it (the same one-line
    errors); for tools and small files: it holds every label as a string."""
    columns: list[list[str]] = [[], [], []]
    lines = []
    for block in text_blocks(path, TRIPLE_LINES):
        rows = split_block(block, path, TRIPLES)
        for column, fields in zip(columns, rows.columns, strict=True):
            labels = [field.decode().strip() for field in fields]
            if not all(labels):
                raise_first_problem(block, path, TRIPLES)
            column.extend(labels)
        lines.append(rows.lines)
    if not columns[0]:
        raise DataError(f"{path}: no triples; {TRIPLE_LINES}")
    return LabelTriples(path, columns[0], columns[1], columns[2], np.concatenate(lines))


class IdMap:
    """Labels <-> ids: ids follow the sorted order of the training labels, so they are
    stable. `labels` reads names from the prepared graph's files as they are asked for."""

    def __init__(self, labels: Sequence[str]) -> None:
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def tsv_blocks(self, rows: int = 1 << 16) -> Iterator[bytes]:
        """`id<TAB>label` lines, readable without shoal, a block at a time."""
        for start in range(0, len(self), rows):
            stop = min(start + rows, len(self))
            labels = self.labels[start:stop]
            yield "".join(f"{i}\t{label}\n" for i, label in enumerate(labels, start)).encode()

    def to_tsv(self) -> str:
        return b"".join(self.tsv_blocks()).decode()


@dataclass
class EvalSplit:
    """Held-out triples as ids, with how many were left out for unseen labels."""

    name: str
    triples: torch.Tensor
    unseen: int
    path: Path


@dataclass
class KGData:
    """A prepared graph's tables as training uses them: `train` and each split's `triples`
    are (n, 3) int64 tensors over the memory-mapped files."""

    entities: IdMap
    relations: IdMap
    train: torch.Tensor
    splits: dict[str, EvalSplit]
    graph: PreparedGraph

    @property
    def stats(self) -> TrainStats:
        """Degrees and per-relation counts of the training triples (negative sampling)."""
        return TrainStats(self.graph.degree, self.graph.relation_counts)

    @property
    def filter(self) -> GraphFilter:
        """Every known triple of every split, by query: what a filtered ranking leaves out."""
        return self.graph.filter


def builtin_paths(name: str) -> dict[str, Path]:
    """The split files of a dataset shipped inside the pykeen wheel, found without importing it."""
    spec = importlib.util.find_spec("pykeen")
    if spec is None or not spec.submodule_search_locations:
        raise ShoalError(
            f"task.data.name = {name!r}: the built-in datasets are read from the pykeen package, "
            "which is not installed; install it with: pip install 'shoal[datasets]'"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "datasets" / name
    paths = {split: folder / f"{split}.txt" for split in ("train", "valid", "test")}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise ShoalError(
            f"task.data.name = {name!r}: the installed pykeen lacks {', '.join(missing)}; "
            "reinstall it with: pip install --force-reinstall 'shoal[datasets]'"
        )
    return paths


def prepared_folder(
    config: KGDataConfig, progress: PrepareProgress | None = None, stall_s: float = 300.0
) -> Path:
    """The prepared folder of `config`: given, or the cache of its TSV files (prepared now
    if it is missing or out of date)."""
    if isinstance(config, PreparedDataConfig):
        return Path(config.prepared).parent
    if isinstance(config, BuiltinDataConfig):
        files, beside = builtin_paths(config.name), False  # never write into site-packages
    else:
        files, beside = {"train": Path(config.train)}, True
        if config.valid:
            files["valid"] = Path(config.valid)
        if config.test:
            files["test"] = Path(config.test)
    return prepared_for(files, progress or PrepareProgress(), stall_s, beside)


def graph_size(config: KGDataConfig) -> tuple[int, int] | None:
    """(entities, relations) of the graph `config` names, read from its manifest without
    preparing anything (the launcher's memory estimate): None for TSV files not prepared
    yet and for the built-in datasets (a few thousand entities)."""
    if isinstance(config, PreparedDataConfig):
        folder = Path(config.prepared).parent
    elif isinstance(config, FilesDataConfig):
        splits = {"train": config.train, "valid": config.valid, "test": config.test}
        folder = cache_folder({name: Path(path) for name, path in splits.items() if path})
    else:
        return None
    try:
        manifest = read_manifest(folder)
    except DataError:
        return None
    return int(manifest["entities"]), int(manifest["relations"])


def load_kg(
    config: KGDataConfig, progress: PrepareProgress | None = None, stall_s: float = 300.0
) -> KGData:
    """Open the graph `config` names (preparing TSV files first if need be).

    Held-out triples whose entity or relation never occurs in training cannot be
    ranked (the model has no row for them): preparation counted them and left them
    out; `unseen = "error"` stops the run at the first instead.
    """
    graph = PreparedGraph.open(prepared_folder(config, progress, stall_s), stall_s)
    splits = {}
    for name, triples in graph.splits.items():
        if name == "train":
            continue
        info = graph.split_info(name)
        if info["unseen"] and config.unseen == "error":
            raise DataError(
                f'{info["first_unseen"]}; set task.data.unseen = "skip" to leave such triples out'
            )
        splits[name] = EvalSplit(
            name, torch.from_numpy(triples), int(info["unseen"]), Path(info["source"])
        )
    return KGData(
        IdMap(graph.entity_names),
        IdMap(graph.relation_names),
        torch.from_numpy(graph.splits["train"]),
        splits,
        graph,
    )
