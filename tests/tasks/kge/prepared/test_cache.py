"""TSV configs prepare into a cache once, under a lock: concurrent starts prepare it once,
a changed file prepares it again, a failure or a stalled holder leaves a clear line."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shoal.errors import DataError
from shoal.tasks.kge.prepared import cache
from shoal.tasks.kge.prepared.cache import cache_folder, prepared_for
from shoal.tasks.kge.prepared.progress import PrepareProgress
from tests.tasks.kge.planted import write_planted_graph


def _prepare(files: dict[str, Path], stall_s: float = 60.0) -> tuple[Path, list[str]]:
    lines: list[str] = []
    folder = prepared_for(files, PrepareProgress("off", lines.append), stall_s)
    return folder, lines


def test_prepared_once_then_reused_then_prepared_again_when_a_file_changes(
    tmp_path: Path,
) -> None:
    files = write_planted_graph(tmp_path)
    folder, lines = _prepare(files)
    assert folder == tmp_path / ".shoal-kge" / folder.name and len(lines) == 1
    again, lines = _prepare(files)
    assert again == folder and lines == []
    stat = files["test"].stat()
    text = files["test"].read_text().replace("e", "x", 1)  # same size, same modification time
    files["test"].write_text(text)
    os.utime(files["test"], ns=(stat.st_atime_ns, stat.st_mtime_ns))
    _, lines = _prepare(files)
    assert len(lines) == 1  # found by its checksum
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name, folder.name + ".lock"]


def test_a_failed_preparation_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "train.txt").write_text("a\tr\tb\nc\tr\n")
    with pytest.raises(DataError, match=r"train.txt:2: expected 3"):
        _prepare({"train": tmp_path / "train.txt"})
    assert [p.name for p in (tmp_path / ".shoal-kge").iterdir()] == [
        cache_folder({"train": tmp_path / "train.txt"}).name + ".lock"
    ]


def test_processes_starting_at_once_prepare_once(tmp_path: Path) -> None:
    files = write_planted_graph(tmp_path)
    script = (
        "import sys; from pathlib import Path\n"
        "from shoal.tasks.kge.prepared.cache import prepared_for\n"
        "from shoal.tasks.kge.prepared.progress import PrepareProgress\n"
        "files = {n: Path(sys.argv[1]) / f'{n}.txt' for n in ('train', 'valid', 'test')}\n"
        "print(prepared_for(files, PrepareProgress('off', lambda line: print('PREPARED')), 60))\n"
    )
    started = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outputs = [process.communicate(timeout=120)[0] for process in started]
    assert all(process.returncode == 0 for process in started)
    assert sum(out.count("PREPARED") for out in outputs) == 1
    assert len({out.splitlines()[-1] for out in outputs}) == 1
    assert cache.is_current(cache_folder(files), files)


def test_a_stalled_holder_is_named_after_the_timeout(tmp_path: Path) -> None:
    files = write_planted_graph(tmp_path)
    folder = cache_folder(files)
    folder.parent.mkdir()
    lock = folder.with_name(folder.name + ".lock")
    holder = open(lock, "w")  # noqa: SIM115
    fcntl.flock(holder, fcntl.LOCK_EX)
    holder.write('{"pid": 4242, "host": "elsewhere", "what": "x"}')
    holder.flush()
    try:
        started = time.monotonic()
        with pytest.raises(DataError) as caught:
            _prepare(files, stall_s=0.5)
        assert time.monotonic() - started < 5
    finally:
        holder.close()
    assert str(caught.value).startswith(f"preparing {files['train']} into {folder}: waited ")
    assert "for process 4242 on elsewhere, which holds" in str(caught.value)
    assert "made no progress for 0.5 s (faults.timeout_s)" in str(caught.value)
