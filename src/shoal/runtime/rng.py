"""Seeding, and capturing every random generator a worker uses so a resume is exact.

States are encoded as JSON (with base64 for torch's byte states) so they can be
gathered over the network and stored without pickle.
"""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def worker_seed(seed: int, rank: int) -> int:
    """The seed of rank `rank`'s training-time randomness (dropout, sampling).

    Distinct per rank, so that replicas do not draw identical dropout masks, and
    fixed by (seed, rank), so that a run is reproducible. Rank 0 uses `seed`.
    """
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0]) if rank else seed


def _b64(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.numpy().tobytes()).decode("ascii")


def _from_b64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def capture_rng() -> bytes:
    """This process's generator states as JSON bytes."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [
            np_name,
            np.asarray(np_keys).tolist(),
            int(np_pos),
            int(np_has_gauss),
            float(np_gauss),
        ],
        "torch": _b64(torch.get_rng_state()),
        "cuda": [_b64(s) for s in torch.cuda.get_rng_state_all()]
        if torch.cuda.is_available()
        else [],
    }
    return json.dumps(state).encode()


def restore_rng(blob: bytes) -> None:
    """Put back the generator states captured by :func:`capture_rng`."""
    state = json.loads(blob.decode())
    version, py_state, gauss = state["python"]
    random.setstate((version, tuple(py_state), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_from_b64(state["torch"]))
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([_from_b64(s) for s in cuda])
