"""Embeddings and id maps written to the run directory, readable without shoal.

`embeddings/` holds `entities.tsv` and `relations.tsv` (`id<TAB>label`), written
when the task starts, and after training `entity_embeddings.npy` (row i is
entity i, as the score uses it: TransE rows at unit length),
`relation_embeddings.npy` (RotatE: phases in radians) and `model.json` (model,
dim, row layout, score). Load with `numpy.load` and any TSV reader.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import torch

from shoal.checkpoint.atomic import atomic_write_bytes
from shoal.tasks.kge.config import KGETaskConfig
from shoal.tasks.kge.models import KGEModel
from shoal.tasks.kge.triples import IdMap

SCORES = {
    "transe": "-||h + r - t||_p",
    "distmult": "sum_i h_i r_i t_i",
    "complex": "Re(sum_i h_i r_i conj(t_i))",
    "rotate": "-sum_i |h_i exp(i theta_i) - t_i|",
}

LAYOUTS = {
    "transe": "real rows of width dim",
    "distmult": "real rows of width dim",
    "complex": "complex rows: [real parts (dim/2), imaginary parts (dim/2)]",
    "rotate": "entities: [real parts (dim/2), imaginary parts (dim/2)]; relations: dim/2 phases",
}


def write_id_maps(folder: Path, entities: IdMap, relations: IdMap) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / "entities.tsv", entities.to_tsv().encode())
    atomic_write_bytes(folder / "relations.tsv", relations.to_tsv().encode())


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


@torch.no_grad()
def export_embeddings(folder: Path, model: KGEModel, config: KGETaskConfig) -> None:
    """Write the embedding tables as .npy and a model.json that says how to score with them."""
    folder.mkdir(parents=True, exist_ok=True)
    entities = model.all_entities().float().cpu().numpy()
    relations = model.relation.weight.float().cpu().numpy()
    atomic_write_bytes(folder / "entity_embeddings.npy", _npy_bytes(entities))
    atomic_write_bytes(folder / "relation_embeddings.npy", _npy_bytes(relations))
    kind = config.model.type
    info = {
        "model": kind,
        "dim": config.dim,
        "p": getattr(config.model, "p", None),
        "score": SCORES[kind],
        "layout": LAYOUTS[kind],
        "entities": "entities.tsv",
        "relations": "relations.tsv",
    }
    atomic_write_bytes(folder / "model.json", (json.dumps(info, indent=2) + "\n").encode())
