"""Reading triples files and mapping labels to ids.

A triples file has one `head<TAB>relation<TAB>tail` a line. CRLF endings are
tolerated (FB15k-237 ships with them: a loader that keeps the `\\r` counts 27,395
"entities" instead of 14,541), blank lines are skipped; gzip, a byte-order mark
and bytes that are not text are handled once for every text input, by
`shoal/textfile.py`. A malformed line stops the run before training with
`file:line: what is wrong`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from shoal.errors import DataError, ShoalError
from shoal.tasks.kge.config import BuiltinDataConfig, FilesDataConfig
from shoal.textfile import read_text

TRIPLE_LINES = "expected head<TAB>relation<TAB>tail lines"


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
    """Parse a triples file; the first malformed line raises a one-line DataError."""
    lines = read_text(path, TRIPLE_LINES).split("\n")
    heads: list[str] = []
    relations: list[str] = []
    tails: list[str] = []
    numbers: list[int] = []
    for number, line in enumerate(lines, start=1):
        cells = line.split("\t")
        if len(cells) == 3:
            head, relation, tail = cells[0].strip(), cells[1].strip(), cells[2].strip()
            if head and relation and tail:
                heads.append(head)
                relations.append(relation)
                tails.append(tail)
                numbers.append(number)
                continue
        elif len(cells) == 1 and not line.strip():
            continue  # a blank line (or the end of the file)
        _reject(path, number, cells)
    if not heads:
        raise DataError(f"{path}: no triples; {TRIPLE_LINES}")
    return LabelTriples(path, heads, relations, tails, np.asarray(numbers, dtype=np.int64))


def _reject(path: Path, number: int, cells: list[str]) -> None:
    if len(cells) != 3:
        raise DataError(
            f"{path}:{number}: expected 3 tab-separated columns (head, relation, tail), "
            f"got {len(cells)}"
        )
    names = ("head", "relation", "tail")
    empty = [name for name, cell in zip(names, cells, strict=True) if not cell.strip()]
    raise DataError(f"{path}:{number}: empty {' and '.join(empty)}")


class IdMap:
    """Labels <-> ids: ids follow the sorted order of the labels, so they are stable."""

    def __init__(self, labels: list[str]) -> None:
        self.labels = sorted(set(labels))
        self.index = {label: i for i, label in enumerate(self.labels)}

    def __len__(self) -> int:
        return len(self.labels)

    def lookup(self, labels: list[str]) -> np.ndarray:
        """Ids of `labels`; -1 for a label this map does not hold."""
        get = self.index.get
        return np.fromiter((get(label, -1) for label in labels), dtype=np.int64, count=len(labels))

    def to_tsv(self) -> str:
        """`id<TAB>label` lines, readable without shoal."""
        return "".join(f"{i}\t{label}\n" for i, label in enumerate(self.labels))


@dataclass
class EvalSplit:
    """Held-out triples as ids, with how many were left out for unseen labels."""

    name: str
    triples: torch.Tensor
    unseen: int
    path: Path


@dataclass
class KGData:
    entities: IdMap
    relations: IdMap
    train: torch.Tensor
    splits: dict[str, EvalSplit]

    def all_known(self) -> torch.Tensor:
        """Every true triple of every split: what a filtered ranking leaves out."""
        triples = torch.cat([self.train, *(s.triples for s in self.splits.values())])
        num_entities, num_relations = len(self.entities), len(self.relations)
        keys = (triples[:, 0] * num_relations + triples[:, 1]) * num_entities + triples[:, 2]
        keys = torch.unique(keys)  # one int64 key per triple: far faster than unique(dim=0)
        tails = keys % num_entities
        relations = (keys // num_entities) % num_relations
        heads = keys // (num_entities * num_relations)
        return torch.stack([heads, relations, tails], dim=1)


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


def _map_split(
    name: str, labels: LabelTriples, entities: IdMap, relations: IdMap, unseen: str
) -> EvalSplit:
    ids = np.stack(
        [
            entities.lookup(labels.heads),
            relations.lookup(labels.relations),
            entities.lookup(labels.tails),
        ],
        axis=1,
    )
    known = (ids >= 0).all(axis=1)
    if unseen == "error" and not known.all():
        row = int(np.flatnonzero(~known)[0])
        what = [
            f"{kind} {label!r}"
            for kind, label, i in zip(
                ("entity", "relation", "entity"),
                (labels.heads[row], labels.relations[row], labels.tails[row]),
                ids[row],
                strict=True,
            )
            if i < 0
        ]
        raise DataError(
            f"{labels.path}:{int(labels.lines[row])}: {' and '.join(what)} never occurs in the "
            'training triples; set task.data.unseen = "skip" to leave such triples out'
        )
    return EvalSplit(name, torch.from_numpy(ids[known]), int((~known).sum()), labels.path)


def load_kg(config: BuiltinDataConfig | FilesDataConfig) -> KGData:
    """Read the splits, build the id maps from training, map held-out splits.

    Held-out triples whose entity or relation never occurs in training cannot be
    ranked (the model has no row for them): they are counted and left out (the
    documented rule, `unseen = "skip"`), or stop the run (`unseen = "error"`).
    """
    if isinstance(config, BuiltinDataConfig):
        files: dict[str, Path] = builtin_paths(config.name)
    else:
        files = {"train": Path(config.train)}
        if config.valid:
            files["valid"] = Path(config.valid)
        if config.test:
            files["test"] = Path(config.test)
    train = read_triples(files["train"])
    entities = IdMap(train.heads + train.tails)
    relations = IdMap(train.relations)
    train_ids = np.stack(
        [
            entities.lookup(train.heads),
            relations.lookup(train.relations),
            entities.lookup(train.tails),
        ],
        axis=1,
    )
    splits = {
        name: _map_split(name, read_triples(path), entities, relations, config.unseen)
        for name, path in files.items()
        if name != "train"
    }
    return KGData(entities, relations, torch.from_numpy(train_ids), splits)
