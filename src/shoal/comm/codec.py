"""State trees (weights, optimizer state, ...) as tensors only, and moving them between ranks.

A codec, not a transport: the tensors travel over `links.py`'s CommGroup. A
state is a tree of dicts, lists and tuples whose leaves are tensors, numbers,
strings, booleans or None (what `state_dict()` returns). It is split into a
JSON skeleton (the structure, the plain leaves, and each tensor's dtype, shape
and place) and one flat uint8 payload holding every tensor's bytes. Both travel
as uint8 tensors over torch.distributed point-to-point messages; the receiver
decodes the skeleton as JSON and rebuilds the tensors from the payload. Nothing
is unpickled, and only dtypes from a fixed list are accepted.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from shoal.comm.links import CommGroup

DTYPES = {
    str(t).removeprefix("torch."): t
    for t in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}


def encode_tree(tree: Any) -> tuple[bytes, torch.Tensor]:
    """(JSON skeleton, payload of every tensor's bytes) of a state tree."""
    parts: list[torch.Tensor] = []
    offset = 0

    def walk(node: Any) -> Any:
        nonlocal offset
        if isinstance(node, torch.Tensor):
            flat = node.detach().contiguous().reshape(-1).view(torch.uint8)
            spec = [str(node.dtype).removeprefix("torch."), list(node.shape), offset, flat.numel()]
            parts.append(flat.cpu())
            offset += flat.numel()
            return {"t": spec}
        if isinstance(node, dict):
            return {"d": [[walk(key), walk(value)] for key, value in node.items()]}
        if isinstance(node, list | tuple):
            return {"l" if isinstance(node, list) else "u": [walk(item) for item in node]}
        if node is None or isinstance(node, bool | int | float | str):
            return {"v": node}
        raise TypeError(f"cannot send a {type(node).__name__} in a state tree")

    skeleton = walk(tree)
    payload = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)
    return json.dumps(skeleton).encode(), payload


def decode_tree(skeleton: bytes, payload: torch.Tensor, device: torch.device) -> Any:
    """The state tree `encode_tree` described, with its tensors on `device`."""

    def build(node: dict[str, Any]) -> Any:
        ((kind, value),) = node.items()
        if kind == "t":
            dtype_name, shape, start, size = value
            if dtype_name not in DTYPES:
                raise ValueError(f"unexpected tensor dtype {dtype_name!r} in a state tree")
            raw = payload[start : start + size].clone()  # fresh storage: aligned for any dtype
            return raw.view(DTYPES[dtype_name]).reshape(shape).to(device)
        if kind == "d":
            return {build(k): build(v) for k, v in value}
        if kind == "l":
            return [build(item) for item in value]
        if kind == "u":
            return tuple(build(item) for item in value)
        return value

    return build(json.loads(skeleton.decode()))


def send_tree(peers: CommGroup, tree: Any, dst: int, what: str, role: str = "") -> None:
    """Send a state tree to rank `dst` (which calls `recv_tree` with this rank): its sizes,
    then its skeleton and payload, all posted before any is waited for."""
    skeleton, payload = encode_tree(tree)
    sizes = torch.tensor([len(skeleton), payload.numel()], dtype=torch.int64)
    parts = [sizes, torch.frombuffer(bytearray(skeleton), dtype=torch.uint8), payload]
    sends = [peers.isend(dst, part.to(peers.device), what, role=role) for part in parts]
    for send in sends:
        send.wait()


def recv_tree(peers: CommGroup, src: int, what: str, device: torch.device, role: str = "") -> Any:
    """Receive the state tree rank `src` sends with `send_tree`; tensors land on `device`."""
    sizes = torch.zeros(2, dtype=torch.int64, device=peers.device)
    peers.irecv(src, sizes, what, role=role).wait()
    skeleton = torch.zeros(int(sizes[0]), dtype=torch.uint8, device=peers.device)
    payload = torch.zeros(int(sizes[1]), dtype=torch.uint8, device=peers.device)
    received = [peers.irecv(src, part, what, role=role) for part in (skeleton, payload)]
    for transfer in received:
        transfer.wait()
    return decode_tree(bytes(skeleton.cpu().numpy().tobytes()), payload, device)
