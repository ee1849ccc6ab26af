"""Opening a prepared folder: a truncated, corrupted or tampered file is refused in one
line naming it; verified files are trusted until they change."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from shoal.errors import DataError
from shoal.tasks.kge.prepared import manifest as manifest_module
from shoal.tasks.kge.prepared.graph import PreparedGraph
from shoal.tasks.kge.prepared.progress import PrepareProgress
from shoal.tasks.kge.prepared.sources import prepare_tsv
from tests.conftest import run_shoal
from tests.tasks.kge.planted import write_planted_graph


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    prepare_tsv(write_planted_graph(tmp_path), tmp_path / "graph", PrepareProgress())
    return tmp_path / "graph"


def _refusal(folder: Path) -> str:
    with pytest.raises(DataError) as caught:
        PreparedGraph.open(folder)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_truncated_file_is_refused_by_its_size(folder: Path) -> None:
    path = folder / "train.npy"
    os.truncate(path, path.stat().st_size - 24)
    assert _refusal(folder) == (
        f"{path}: truncated ({path.stat().st_size} bytes, manifest.json says "
        f"{path.stat().st_size + 24}); prepare it again with: shoal kge prepare"
    )


def test_a_changed_byte_is_found_by_its_checksum(folder: Path) -> None:
    PreparedGraph.open(folder)  # verified and stamped
    path = folder / "filter_tails_answers.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # same size; a new modification time
    path.write_bytes(bytes(data))
    assert _refusal(folder) == (
        f"{path}: corrupt (its sha256 differs from manifest.json); "
        "prepare it again with: shoal kge prepare"
    )


def test_verified_files_are_not_hashed_again(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (folder / "verified.json").unlink()  # as if copied here: the first use hashes
    for path in folder.iterdir():  # written an hour ago
        os.utime(path, ns=(path.stat().st_atime_ns, time.time_ns() - 3600 * 10**9))
    hashed: list[str] = []
    real = manifest_module.sha256_of
    monkeypatch.setattr(manifest_module, "sha256_of", lambda p: hashed.append(p.name) or real(p))
    PreparedGraph.open(folder)
    assert "train.npy" in hashed
    hashed.clear()
    PreparedGraph.open(folder)
    assert hashed == []


def test_a_tampered_manifest_breaks_its_seal(folder: Path) -> None:
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["entities"] += 1
    path.write_text(json.dumps(manifest))
    assert _refusal(folder) == (
        f"{path}: corrupt (its seal does not match its content); "
        "prepare it again with: shoal kge prepare"
    )


def test_a_folder_without_manifest_says_how_to_prepare(tmp_path: Path) -> None:
    assert _refusal(tmp_path) == (
        f"{tmp_path}: not a prepared graph (no manifest.json); "
        "prepare it again with: shoal kge prepare"
    )


def test_the_cli_verifies_every_byte_and_validates_sizes(folder: Path, tmp_path: Path) -> None:
    done = run_shoal("kge", "verify", str(folder), cwd=tmp_path)
    assert done.returncode == 0 and "match manifest.json" in done.stdout
    path = folder / "entity_degree.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    os.utime(path, ns=(0, 0))
    done = run_shoal("kge", "verify", str(folder), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        f"{path}: corrupt (its sha256 differs from manifest.json); "
        "prepare it again with: shoal kge prepare"
    )
    os.truncate(path, 10)
    (tmp_path / "job.toml").write_text(
        '[task]\ntype = "kge"\nmodel = "distmult"\ndata = { prepared = "graph" }\n'
        "[train]\nepochs = 1\nbatch_size = 8\n"
    )
    done = run_shoal("config", "validate", "job.toml", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"job.toml:4: task.data.prepared: {path}: truncated (10 bytes, "
        f"manifest.json says {len(data)}); prepare it again with: shoal kge prepare"
    )
