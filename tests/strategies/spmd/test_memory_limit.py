"""A model whose parameters and Adam state do not fit one process trains under fully_sharded
over 4 ranks, each rank held to its own memory limit (a cgroup v1 memory controller).

Each rank builds the model on the meta device and materialises only its shards, so what it
holds grows as a quarter of the model: the test measures a 2-block model's peak per rank
(the constant: Python, torch, transformers, one gathered block), then trains an 8-block
model of the same width with every rank in a cgroup whose limit the local model's state
alone exceeds, and checks each rank's peak against (1/4 + 10 %) of the full model's
training state (parameters, gradients, Adam's moments) plus that constant. The local run
of the 8-block model in the same limit is killed (it does not fit).

The ranks run with glibc's mmap threshold fixed (`MALLOC_MMAP_THRESHOLD_`): by default it
rises to the largest buffer freed (up to 32 MiB), so the per-block buffers FSDP gathers and
frees stay in the heap and the peak resident set counts memory the process no longer uses;
fixed, freed buffers go back to the system and the peak is what was live.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cgroup_ranks import llama_job, memory_cgroups, rank_logs, run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from _cgroup import unavailable

pytest.importorskip("transformers")

WIDTH = 768
RANKS = 4
#: what training holds per parameter (ZeRO's "model states"): the parameter, its gradient
#: and Adam's two moments, float32
STATE_BYTES_PER_PARAMETER = 16
#: freed buffers of 64 KiB and more go back to the system (see the module docstring)
MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(64 << 10)}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(unavailable() is not None, reason=str(unavailable())),
]


def parameters(layers: int) -> int:
    width, inner, vocab = WIDTH, 4 * WIDTH, 256
    block = 4 * width * width + 3 * width * inner + 2 * width
    return layers * block + 2 * vocab * width + width


def write_job(folder: Path, name: str, layers: int, strategy: dict[str, Any]) -> Path:
    return llama_job(folder, name, strategy, layers, WIDTH, steps=2)


def test_a_model_larger_than_a_rank_trains_fully_sharded_over_four(tmp_path: Path) -> None:
    small_job = write_job(tmp_path, "small", 2, {"type": "fully_sharded", "degree": RANKS})
    with memory_cgroups(RANKS, None) as groups:
        small = run_ranks(small_job, RANKS, groups, extra_env=MALLOC)
    assert [r.code for r in small] == [0] * RANKS, rank_logs(small_job)
    small_state = STATE_BYTES_PER_PARAMETER * parameters(2)
    constant = max(r.peak_rss_bytes for r in small) - (0.25 + 0.10) * small_state

    layers = 8
    state = STATE_BYTES_PER_PARAMETER * parameters(layers)
    limit = int(constant + 0.5 * state)
    assert limit < constant + state  # the whole model's state alone does not fit
    big_job = write_job(tmp_path, "big", layers, {"type": "fully_sharded", "degree": RANKS})
    with memory_cgroups(RANKS, limit) as groups:
        big = run_ranks(big_job, RANKS, groups, extra_env=MALLOC)
    assert [r.code for r in big] == [0] * RANKS, f"limit {limit >> 20} MiB:\n{rank_logs(big_job)}"
    bound = constant + (0.25 + 0.10) * state
    measured = [r.peak_rss_bytes for r in big]
    assert max(measured) <= bound, (measured, bound, constant, state)

    local_job = write_job(tmp_path, "local", layers, {"type": "local"})
    with memory_cgroups(1, limit) as groups:
        (local,) = run_ranks(local_job, 1, groups, extra_env=MALLOC)
    assert local.code != 0  # killed: the local model does not fit the limit
