"""A peer that stops answering is named, within faults.timeout_s, not waited for forever."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from shoal.comm.links import CommGroup, PeerTimeout, rank_chunks
from shoal.comm.ring import RingAllReduce
from shoal.shape.hosts import Hosts
from tests.comm.group import fails_naming, run_in_group


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


def _counted_collectives(rank: int, world_size: int) -> None:
    peers = CommGroup.create(rank, world_size, Hosts.single(world_size), timeout_s=10.0)
    seen: list[tuple[str, str, list[float]]] = []
    peers.audit = lambda what, direction, t: seen.append((what, direction, t.tolist()))
    total = peers.all_reduce_sum(torch.tensor([float(rank), 1.0]), "sums")
    assert total.tolist() == [3.0, 3.0]  # ranks 0 + 1 + 2, and three ones
    rows = peers.all_gather(torch.tensor([rank, 10 * rank]), "rows")
    assert [r.tolist() for r in rows] == [[0, 0], [1, 10], [2, 20]]
    neighbour = torch.zeros(3)
    peers.exchange(
        [((rank + 1) % world_size, torch.full((3,), float(rank)))],
        [((rank - 1) % world_size, neighbour)],
        "ring step",
    )
    assert neighbour.tolist() == [float((rank - 1) % world_size)] * 3
    # every byte counted once, in one place: 2 floats reduced, 2 int64s gathered from the
    # two other ranks, 3 floats each way
    assert peers.sent_bytes == 8 + 16 + 12 and peers.received_bytes == 8 + 2 * 16 + 12
    assert [(w, d) for w, d, _ in seen] == [
        ("sums", "sent"),
        ("sums", "received"),
        ("rows", "sent"),
        *[("rows", "received")] * 2,
        ("ring step", "sent"),
        ("ring step", "received"),
    ]
    assert seen[1][2] == [3.0, 3.0]


def test_collectives_and_exchanges_are_counted_and_audited_in_one_place(tmp_path: Path) -> None:
    assert run_in_group(3, _counted_collectives, tmp_path) == [0, 1, 2]


def _absent_from_collective(rank: int, world_size: int) -> None:
    peers = CommGroup.create(rank, world_size, Hosts.single(world_size), timeout_s=2.0)
    if rank == 1:
        time.sleep(4)  # alive, but never joins
        return
    fails_naming(
        lambda: peers.all_reduce_sum(torch.ones(4), "round_status"),
        "round_status: rank 0 waited 2 s (faults.timeout_s) for the group of 2 ranks: ",
        within_s=3.5,
    )


def test_a_collective_that_does_not_complete_names_the_group_within_the_timeout(
    tmp_path: Path,
) -> None:
    assert run_in_group(2, _absent_from_collective, tmp_path) == [0, 1]


def _silent_server(rank: int, world_size: int) -> None:
    peers = CommGroup.create(rank, world_size, Hosts.single(world_size), timeout_s=1.0)
    if rank == 1:
        time.sleep(2.5)
        return
    reply = peers.irecv(1, torch.zeros(2), "the reply to worker 0's pull", tag=5, role="server 0")
    fails_naming(
        reply.wait,
        "the reply to worker 0's pull: rank 0 failed receiving from server 0 (rank 1) "
        "(faults.timeout_s = 1 s): ",
        within_s=2.0,
    )


def test_a_peer_is_named_by_its_role(tmp_path: Path) -> None:
    assert run_in_group(2, _silent_server, tmp_path) == [0, 1]
