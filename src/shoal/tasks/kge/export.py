"""Embeddings and id maps written to the run directory, readable without shoal.

`embeddings/` holds `entities.tsv` and `relations.tsv` (`id<TAB>label`), written
when the task starts, and after training `entity_embeddings.npy` (row i is
entity i, as the score uses it: TransE rows at unit length),
`relation_embeddings.npy` (RotatE: phases in radians; with reciprocal relations
the inverse relations follow the relations) and `model.json` (model, dim, row
layout, score). Load with `numpy.load` and any TSV reader.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from shoal.checkpoint.atomic import atomic_write_bytes, fsync_dir
from shoal.tasks.kge.config import KGETaskConfig
from shoal.tasks.kge.models import KGEModel
from shoal.tasks.kge.triples import IdMap


def write_id_maps(folder: Path, entities: IdMap, relations: IdMap) -> None:
    """`entities.tsv` and `relations.tsv`, written a block at a time, each renamed into place."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, ids in (("entities.tsv", entities), ("relations.tsv", relations)):
        path = folder / name
        tmp = path.with_name(f".{name}.tmp")
        with open(tmp, "wb") as out:
            for block in ids.tsv_blocks():
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    fsync_dir(folder)


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _write_npy_blocks(path: Path, blocks: Iterator[np.ndarray]) -> None:
    """An .npy written block by block (never the whole table in memory), renamed into place."""
    parts = []
    tmp = path.with_name(f".{path.name}.parts")
    with open(tmp, "wb") as raw:
        for block in blocks:
            raw.write(np.ascontiguousarray(block, dtype=np.float32).tobytes())
            parts.append(block.shape)
    rows = sum(shape[0] for shape in parts)
    width = parts[0][1] if parts else 0
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (rows, width)}
    )
    final_tmp = path.with_name(f".{path.name}.tmp")
    with open(final_tmp, "wb") as out, open(tmp, "rb") as body:
        out.write(header.getvalue())
        while chunk := body.read(1 << 20):
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    tmp.unlink()
    os.replace(final_tmp, path)
    fsync_dir(path.parent)


@torch.no_grad()
def export_embeddings(folder: Path, model: KGEModel, config: KGETaskConfig) -> None:
    """Write the embedding tables as .npy and a model.json that says how to score with them."""
    folder.mkdir(parents=True, exist_ok=True)
    if model.served is not None:  # tables on a parameter server: stream them in blocks
        served = model.served
        blocks = (model.prepare_entities(b).float().cpu().numpy() for b in served.entity_blocks())
        _write_npy_blocks(folder / "entity_embeddings.npy", blocks)
        relation_rows = served.rows("relation", torch.arange(served.num_relations))
        relations = relation_rows.float().cpu().numpy()
    else:
        entities = model.all_entities().float().cpu().numpy()
        atomic_write_bytes(folder / "entity_embeddings.npy", _npy_bytes(entities))
        relations = model.relation.weight.float().cpu().numpy()
    atomic_write_bytes(folder / "relation_embeddings.npy", _npy_bytes(relations))
    kind = config.model.type
    info = {
        "model": kind,
        "dim": config.dim,
        "p": getattr(config.model, "p", None),
        "score": type(model).formula,
        "layout": type(model).layout,
        "reciprocal": config.model.reciprocal,
        "relation_rows": (
            "relation r, then its reciprocal r^-1 at row r + relations (head queries (?, r, t) "
            "score as tail queries (t, r^-1, ?))"
            if config.model.reciprocal
            else "relation r"
        ),
        "entities": "entities.tsv",
        "relations": "relations.tsv",
    }
    atomic_write_bytes(folder / "model.json", (json.dumps(info, indent=2) + "\n").encode())
