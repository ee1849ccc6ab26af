"""A peer that stops answering is named, within faults.timeout_s, not waited for forever."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from shoal.comm.links import CommGroup, PeerTimeout, rank_chunks
from shoal.comm.ring import RingAllReduce
from shoal.runtime.hosts import Hosts
from tests.comm.group import run_in_group


def test_rank_chunks_cover_any_length() -> None:
    for length in range(0, 12):
        for parts in range(1, 6):
            chunks = rank_chunks(length, parts)
            assert len(chunks) == parts and chunks[0][0] == 0 and chunks[-1][1] == length
            sizes = [b - a for a, b in chunks]
            assert max(sizes) - min(sizes) <= 1
            assert all(chunks[i][1] == chunks[i + 1][0] for i in range(parts - 1))


def _silent_peer(rank: int, world_size: int) -> None:
    links = CommGroup.create(rank, world_size, Hosts.single(world_size), timeout_s=2.0)
    if rank == 1:
        time.sleep(4)  # alive, but never takes part
        return
    started = time.monotonic()
    with pytest.raises(PeerTimeout) as caught:
        RingAllReduce(links).start(torch.ones(10)).wait()
    assert time.monotonic() - started < 3.5
    message = str(caught.value)
    assert message.startswith(
        "ring all-reduce: rank 0 failed receiving from rank 1 (faults.timeout_s = 2 s): Timed out"
    ), message
    assert ".cc:" not in message


def test_a_silent_peer_is_named_within_the_timeout(tmp_path: Path) -> None:
    assert run_in_group(2, _silent_peer, tmp_path) == [0, 1]
