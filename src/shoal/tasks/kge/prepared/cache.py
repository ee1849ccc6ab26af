"""TSV configs train from a prepared graph too: one prepared on first use, kept beside them.

The cache of `train.txt` lives in `.shoal-kge/train.txt-<key>/` in the same folder
(the key: a hash of the split files' paths), or under the user's cache folder
(`$XDG_CACHE_HOME/shoal/kge`, by default `~/.cache/shoal/kge`) when that folder is
read-only or the files come from an installed package (the built-in datasets).

It is current while every source is the file it was prepared from: same size and
modification time, with the time at least `RACY_S` older than the preparation's
start (else the file may have changed within the clock's resolution, as git's
"racy" index entries), or else the same sha256.

Several processes may start at once (every rank of a job): one takes the lock,
prepares into a temporary folder and renames it into place; the others wait on the
lock and then find the folder current. A failed preparation leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from shoal.errors import DataError
from shoal.tasks.kge.prepared.lock import FolderLock
from shoal.tasks.kge.prepared.manifest import RACY_S, check_sizes, read_manifest, sha256_of
from shoal.tasks.kge.prepared.progress import PrepareProgress
from shoal.tasks.kge.prepared.sources import prepare_tsv

CACHE_FOLDER = ".shoal-kge"


def user_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shoal" / "kge"


def _writable(folder: Path) -> bool:
    """Writable, and not marked read-only for everyone (as shared datasets are): root may
    write anywhere, and should not write there."""
    return os.access(folder, os.W_OK) and bool(folder.stat().st_mode & 0o222)


def _cache_root(train: Path, beside: bool) -> Path:
    if beside and _writable(train.parent):
        return train.parent / CACHE_FOLDER
    return user_cache()


def cache_folder(files: dict[str, Path], beside: bool = True) -> Path:
    """Where the prepared graph of `files` is kept."""
    train = files["train"]
    paths = json.dumps({name: str(path) for name, path in sorted(files.items())})
    key = hashlib.sha256(paths.encode()).hexdigest()[:16]
    return _cache_root(train, beside) / f"{train.name}-{key}"


def is_current(folder: Path, files: dict[str, Path]) -> bool:
    """Whether `folder` holds the graph prepared from `files` as they are now."""
    try:
        manifest = read_manifest(folder)
        check_sizes(folder, manifest)
    except DataError:
        return False
    sources: dict[str, Any] = manifest.get("sources", {})
    if set(sources) != set(files):
        return False
    return all(_same_file(files[name], sources[name]) for name in files)


def _same_file(path: Path, recorded: dict[str, Any]) -> bool:
    try:
        stat = path.stat()
    except OSError:
        return False
    if str(path) != recorded["path"] or stat.st_size != recorded["bytes"]:
        return False
    settled = stat.st_mtime_ns < recorded["read_at_ns"] - RACY_S * 1e9
    if stat.st_mtime_ns == recorded["mtime_ns"] and settled:
        return True
    return sha256_of(path) == recorded["sha256"]


def prepared_for(
    files: dict[str, Path],
    progress: PrepareProgress,
    stall_s: float = 300.0,
    beside: bool = True,
) -> Path:
    """The prepared graph of TSV `files` (train, valid, test), prepared now if need be."""
    folder = cache_folder(files, beside)
    folder.parent.mkdir(parents=True, exist_ok=True)
    what = f"preparing {files['train']} into {folder}"
    with FolderLock(folder.with_name(folder.name + ".lock"), what, stall_s) as lock:
        if is_current(folder, files):
            return folder
        progress.beats.append(lock.beat)
        for stale in folder.parent.glob(f"{folder.name}.tmp-*"):  # a crashed holder's
            shutil.rmtree(stale, ignore_errors=True)
        temporary = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
        started = time.perf_counter()
        try:
            prepare_tsv(files, temporary, progress)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        finally:
            progress.close()
        if folder.exists():  # out of date: moved away, replaced, then deleted
            old = folder.with_name(f"{folder.name}.old-{os.getpid()}")
            os.rename(folder, old)
            os.rename(temporary, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(temporary, folder)
        progress.log(
            f"prepared {files['train']} in {time.perf_counter() - started:.1f} s: {folder}"
        )
    return folder
