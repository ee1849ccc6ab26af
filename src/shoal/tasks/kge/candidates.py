"""The entities a sampled ranking compares a query's answer with: k distinct entities,
never the answer, a function of (seed, side, query) alone.

Distinct without a set or a retry loop: candidate j of a query is position j of a
pseudo-random permutation of the entities other than the answer, keyed by the
query. The permutation is a 4-round Feistel network over the smallest even power
of two that holds them (SplitMix64's finalizer as round function), cycle-walked
into range (Black and Rogaway, 2002): a value outside the range is permuted again
until it falls inside, which on average takes fewer than four rounds. So k draws
are k different entities, and with k at least the entities other than the answer,
they are all of them, and sampled ranking is full ranking.

The draws depend on the query's index in the split, not on which worker ranks it,
in which batch, or when: the same candidates at every evaluation and any world size.
"""

from __future__ import annotations

import numpy as np

from shoal.tasks.kge.sampling import mix64

_STREAM_TAIL = 0xE7A1
_STREAM_HEAD = 0xE7A2
_ROUNDS = 4


def _keys(seed: int, head: bool, queries: np.ndarray) -> np.ndarray:
    stream = _STREAM_HEAD if head else _STREAM_TAIL
    with np.errstate(over="ignore"):
        base = mix64(mix64(np.array([seed], dtype=np.uint64)) ^ np.uint64(stream))
        return mix64(base ^ mix64(queries.astype(np.uint64)))


def _feistel(values: np.ndarray, keys: np.ndarray, half: int) -> np.ndarray:
    """One pass of the keyed permutation of [0, 4^half): `keys` broadcast against `values`."""
    mask = np.uint64((1 << half) - 1)
    shift = np.uint64(half)
    left, right = values >> shift, values & mask
    with np.errstate(over="ignore"):
        for round_index in range(_ROUNDS):
            mixed = mix64(keys ^ mix64(right + np.uint64(round_index) * np.uint64(0x9E3779B9)))
            left, right = right, left ^ (mixed & mask)
    return (left << shift) | right


def sample_candidates(
    seed: int, head: bool, queries: np.ndarray, answers: np.ndarray, count: int, entities: int
) -> np.ndarray:
    """(len(queries), min(count, entities - 1)) distinct entities per query, none its answer.

    `queries`: each query's index in its split (the key of its draws); `answers`: the
    entity each query is answered by.
    """
    domain = entities - 1  # every entity but the answer
    k = min(count, domain)
    half = max(1, (max(domain - 1, 1).bit_length() + 1) // 2)
    keys = _keys(seed, head, queries)[:, None]
    values = np.broadcast_to(np.arange(k, dtype=np.uint64), (len(queries), k)).copy()
    values = _feistel(values, keys, half)
    outside = values >= domain
    while outside.any():  # cycle-walking: permute again until inside the range
        rows = np.nonzero(outside)[0]
        values[outside] = _feistel(values[outside], keys[rows, 0], half)
        outside = values >= domain
    picked = values.astype(np.int64)
    return picked + (picked >= answers[:, None])  # skip the answer
