"""What makes a folder a prepared graph: `manifest.json`, sealed, naming every file.

The manifest gives the graph's sizes (entities, relations, triples per split), where
each split came from, and for every file its bytes, sha256 and (arrays) dtype and
shape. Opening a folder always compares each file's size with the manifest (a stat
per file: a truncated copy is refused at once) and every array's header with its
dtype and shape. The checksums are compared once per version of the files: the
first use after they were written, copied or changed verifies every byte and leaves
`verified.json` (each file's size, modification time and inode), so later uses
trust what has not changed since (files written within seconds of that check are
checked again: a change so close to it could leave the modification time as it was).
`shoal kge verify FOLDER` checks every byte again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from shoal.checkpoint.atomic import atomic_write_bytes
from shoal.errors import DataError

MANIFEST = "manifest.json"
VERIFIED = "verified.json"
FORMAT = "shoal-kge-graph"
VERSION = 1
SEAL = "manifest_sha256"
PREPARE_AGAIN = "prepare it again with: shoal kge prepare"
RACY_S = 2.0


def sha256_of(path: Path) -> str:
    """The file's sha256, read through one small reused buffer (hashlib's): checking a
    graph's files allocates no more at a billion triples than at a thousand."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _seal(body: dict[str, Any]) -> str:
    unsealed = {k: v for k, v in body.items() if k != SEAL}
    return hashlib.sha256(json.dumps(unsealed, sort_keys=True).encode()).hexdigest()


def describe_files(folder: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """{name: bytes, sha256 (and dtype, shape for .npy)} of files just written."""
    files: dict[str, dict[str, Any]] = {}
    for name in sorted(names):
        path = folder / name
        entry: dict[str, Any] = {"bytes": path.stat().st_size, "sha256": sha256_of(path)}
        if name.endswith(".npy"):
            array = np.load(path, mmap_mode="r", allow_pickle=False)
            entry["dtype"] = array.dtype.str
            entry["shape"] = list(array.shape)
        files[name] = entry
    return files


def write_manifest(folder: Path, body: dict[str, Any]) -> dict[str, Any]:
    """Seal and write the manifest, then mark every file verified (they were just hashed)."""
    manifest = {"format": FORMAT, "version": VERSION, **body}
    manifest[SEAL] = _seal(manifest)
    atomic_write_bytes(folder / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
    write_verified(folder, manifest)
    return manifest


def read_manifest(folder: Path) -> dict[str, Any]:
    """The sealed manifest of `folder`, or one line that says why it is not a prepared graph."""
    path = folder / MANIFEST
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder; prepare a graph with: shoal kge prepare")
    if not path.is_file():
        raise DataError(f"{folder}: not a prepared graph (no {MANIFEST}); {PREPARE_AGAIN}")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(f"{path}: unreadable ({exc}); {PREPARE_AGAIN}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(f"{path}: not the manifest of a prepared graph; {PREPARE_AGAIN}")
    if manifest.get("version") != VERSION:
        raise DataError(
            f"{path}: prepared graph format {manifest.get('version')}, this shoal reads "
            f"{VERSION}; {PREPARE_AGAIN}"
        )
    if manifest.get(SEAL) != _seal(manifest):
        raise DataError(f"{path}: corrupt (its seal does not match its content); {PREPARE_AGAIN}")
    return manifest


def check_sizes(folder: Path, manifest: dict[str, Any]) -> None:
    """Every file the manifest names is there with its size (a stat per file)."""
    for name, entry in manifest["files"].items():
        path = folder / name
        try:
            size = path.stat().st_size
        except OSError:
            raise DataError(f"{path}: missing from the prepared graph; {PREPARE_AGAIN}") from None
        if size != entry["bytes"]:
            what = "truncated" if size < entry["bytes"] else "longer than written"
            raise DataError(
                f"{path}: {what} ({size} bytes, {MANIFEST} says {entry['bytes']}); {PREPARE_AGAIN}"
            )


def check_array(path: Path, array: np.ndarray, entry: dict[str, Any]) -> None:
    """An array's header says what the manifest says."""
    if array.dtype.str != entry.get("dtype") or list(array.shape) != entry.get("shape"):
        raise DataError(
            f"{path}: holds {array.dtype.str} {list(array.shape)}, {MANIFEST} says "
            f"{entry.get('dtype')} {entry.get('shape')}; {PREPARE_AGAIN}"
        )


def _file_stats(folder: Path, manifest: dict[str, Any]) -> dict[str, list[int]]:
    files = {}
    for name in sorted(manifest["files"]):
        stat = (folder / name).stat()
        files[name] = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
    return files


def write_verified(folder: Path, manifest: dict[str, Any]) -> None:
    """Record that every file, as it is now, matched its checksum (skipped if read-only)."""
    stamp = {
        "manifest": manifest[SEAL],
        "at_ns": time.time_ns(),
        "files": _file_stats(folder, manifest),
    }
    with contextlib.suppress(OSError):  # a read-only folder: every use verifies
        atomic_write_bytes(folder / VERIFIED, json.dumps(stamp).encode())


def is_verified(folder: Path, manifest: dict[str, Any]) -> bool:
    """Whether the files are those last verified: same size, modification time and inode,
    and modified at least RACY_S before the verification (a change within the clock's
    resolution of it could leave the time as it was: git's "racy" entries)."""
    try:
        stamp = json.loads((folder / VERIFIED).read_text())
        files = _file_stats(folder, manifest)
        settled = all(mtime < stamp["at_ns"] - RACY_S * 1e9 for _, mtime, _ in files.values())
        return bool(stamp["manifest"] == manifest[SEAL] and stamp["files"] == files and settled)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def verify_checksums(folder: Path, manifest: dict[str, Any]) -> None:
    """Every byte of every file against its sha256; the first mismatch raises one line."""
    check_sizes(folder, manifest)
    for name, entry in manifest["files"].items():
        if sha256_of(folder / name) != entry["sha256"]:
            raise DataError(
                f"{folder / name}: corrupt (its sha256 differs from {MANIFEST}); {PREPARE_AGAIN}"
            )
    write_verified(folder, manifest)


def source_stat(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"path": str(path), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}
