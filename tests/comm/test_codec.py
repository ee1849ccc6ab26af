"""State trees cross ranks as tensors, exactly, over the peer layer; a lost sender is named."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from shoal.comm.codec import decode_tree, encode_tree, recv_tree, send_tree
from shoal.comm.links import CommGroup
from shoal.shape.hosts import Hosts
from tests.comm.group import fails_naming, run_in_group


def same(a: Any, b: Any) -> None:
    assert isinstance(b, dict) if isinstance(a, dict) else type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)  # int keys of optimizer state stay ints
        for key in a:
            same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    else:
        assert a == b


def test_state_tree_round_trip_is_exact() -> None:
    model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(6, 5)).sum().backward()
    optimizer.step()
    tree = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "odd": [torch.tensor(True), torch.arange(3, dtype=torch.int16), (1, None, "x", 2.5)],
        "half": torch.randn(2, 3).to(torch.bfloat16),
    }
    skeleton, payload = encode_tree(tree)
    assert payload.dtype == torch.uint8
    back = decode_tree(skeleton, payload, torch.device("cpu"))
    same(tree, back)
    fresh = torch.optim.AdamW(model.parameters(), lr=0.01)
    fresh.load_state_dict(back["optimizer"])
    with pytest.raises(ValueError, match="unexpected tensor dtype"):
        decode_tree(skeleton.replace(b'"float32"', b'"object"'), payload, torch.device("cpu"))


def _tree() -> dict[str, Any]:
    generator = torch.Generator().manual_seed(3)
    return {
        "weights": torch.randn(7, 5, generator=generator),
        "step": 12,
        "odd": [torch.arange(4, dtype=torch.int16), (None, "x", 2.5), torch.tensor(True)],
    }


def _send_and_lose(rank: int, world_size: int) -> None:
    peers = CommGroup.create(rank, world_size, Hosts.single(world_size), timeout_s=2.0)
    what = "member 3's state for member 1"
    if rank == 0:
        send_tree(peers, _tree(), 1, what)
        skeleton, payload = encode_tree(_tree())
        # sizes, skeleton and payload, counted where they were sent
        assert peers.sent_bytes == 16 + len(skeleton) + payload.numel()
        assert peers.received_bytes == 0
        time.sleep(4)  # alive, but sends no second tree
        return
    same(_tree(), recv_tree(peers, 0, what, torch.device("cpu"), "member 3's host"))
    assert peers.received_bytes > 16 and peers.sent_bytes == 0
    fails_naming(
        lambda: recv_tree(peers, 0, what, torch.device("cpu"), "member 3's host"),
        "member 3's state for member 1: rank 1 failed receiving from member 3's host (rank 0) "
        "(faults.timeout_s = 2 s): ",
        within_s=3.5,
    )


def test_a_tree_crosses_exactly_and_a_lost_sender_is_named_with_its_role(tmp_path: Path) -> None:
    assert run_in_group(2, _send_and_lose, tmp_path) == [0, 1]
