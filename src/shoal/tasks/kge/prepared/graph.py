"""A prepared graph, opened: every array memory-mapped, nothing read until it is used.

A process that opens a folder holds the manifest, small headers and the maps; the
pages of a split, of the names or of the filter index are read from the page cache
(shared by every process of the machine) when an access touches them. So N workers
on one machine hold the graph once, in the page cache, not N times in their heaps.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from shoal.tasks.kge.prepared.filter_build import DIRECTIONS, filter_files
from shoal.tasks.kge.prepared.filter_index import GraphFilter, QueryIndex
from shoal.tasks.kge.prepared.lock import FolderLock
from shoal.tasks.kge.prepared.manifest import (
    check_array,
    check_sizes,
    is_verified,
    read_manifest,
    verify_checksums,
)
from shoal.tasks.kge.prepared.names import Names, names_files
from shoal.tasks.kge.prepared.npy import open_npy
from shoal.tasks.kge.prepared.writer import DEGREE, RELATION_COUNTS, split_file

VERIFY_LOCK = ".verify.lock"


def verify_once(folder: Path, manifest: dict[str, Any], stall_s: float) -> None:
    """Check every byte against the manifest unless these very files were checked before;
    one process at a time (the others wait, then find them checked)."""
    if is_verified(folder, manifest):
        return
    if not os.access(folder, os.W_OK):
        verify_checksums(folder, manifest)  # nowhere to record it: every use checks
        return
    with FolderLock(folder / VERIFY_LOCK, f"verifying {folder}", stall_s):
        if not is_verified(folder, manifest):
            verify_checksums(folder, manifest)


class PreparedGraph:
    """The arrays of a prepared folder (see `writer.py` for what each holds)."""

    def __init__(self, folder: Path, manifest: dict[str, Any]) -> None:
        self.folder = folder
        self.manifest = manifest
        self.num_entities = int(manifest["entities"])
        self.num_relations = int(manifest["relations"])
        self.splits = {name: self._array(split_file(name), True) for name in manifest["splits"]}
        self.entity_names = self._names("entity")
        self.relation_names = self._names("relation")
        self.degree = self._array(DEGREE)
        self.relation_counts = self._array(RELATION_COUNTS)
        indexes = {
            direction: QueryIndex(*(self._array(name, True) for name in filter_files(direction)))
            for direction in DIRECTIONS
        }
        self.filter = GraphFilter(indexes["tails"], indexes["heads"], self.num_relations)

    @classmethod
    def open(cls, folder: Path, stall_s: float = 300.0) -> PreparedGraph:
        """Open `folder`: the manifest and every file's size always, every checksum on the
        first use of these files (one line naming the file if anything is wrong)."""
        manifest = read_manifest(folder)
        check_sizes(folder, manifest)
        verify_once(folder, manifest, stall_s)
        return cls(folder, manifest)

    def split_info(self, name: str) -> dict[str, Any]:
        """Where split `name` came from, and its held-out triples left out."""
        info: dict[str, Any] = self.manifest["splits"][name]
        return info

    def _array(self, name: str, random_access: bool = False) -> np.ndarray:
        """A file's array, checked against the manifest (`random_access`: rows read at
        random, as batches and binary searches read them)."""
        array = open_npy(self.folder / name, random_access)
        check_array(self.folder / name, array, self.manifest["files"][name])
        return array

    def _names(self, table: str) -> Names:
        data_name, offsets_name = names_files(table)
        path = self.folder / data_name
        data = (
            np.memmap(path, dtype=np.uint8, mode="r")
            if path.stat().st_size
            else np.zeros(0, dtype=np.uint8)
        )
        return Names(data, self._array(offsets_name))
