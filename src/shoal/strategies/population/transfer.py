"""Moving a member's state (weights, optimizer state, ...) between ranks, as tensors only.

A state is a tree of dicts, lists and tuples whose leaves are tensors, numbers,
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
import torch.distributed as dist

from shoal.runtime.context import WorkerContext

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


class PeerLost(RuntimeError):
    """A point-to-point exchange failed: the peer died or stopped answering (a timeout)."""


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
        raise TypeError(f"cannot send a {type(node).__name__} in a member's state")

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
                raise ValueError(f"unexpected tensor dtype {dtype_name!r} in a member's state")
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


def send_tree(ctx: WorkerContext, tree: Any, dst: int, what: str) -> None:
    """Send a state tree to rank `dst` (which calls `recv_tree` with this rank)."""
    skeleton, payload = encode_tree(tree)
    device = ctx.comm_device
    sizes = torch.tensor([len(skeleton), payload.numel()], dtype=torch.int64, device=device)
    try:
        dist.send(sizes, dst)
        dist.send(torch.frombuffer(bytearray(skeleton), dtype=torch.uint8).to(device), dst)
        if payload.numel():
            dist.send(payload.to(device), dst)
    except RuntimeError as exc:
        raise PeerLost(_lost(ctx, dst, what, exc)) from exc


def recv_tree(ctx: WorkerContext, src: int, what: str) -> Any:
    """Receive the state tree rank `src` sends with `send_tree`; tensors land on ctx.device."""
    device = ctx.comm_device
    sizes = torch.zeros(2, dtype=torch.int64, device=device)
    try:
        dist.recv(sizes, src)
        skeleton = torch.zeros(int(sizes[0]), dtype=torch.uint8, device=device)
        dist.recv(skeleton, src)
        payload = torch.zeros(int(sizes[1]), dtype=torch.uint8, device=device)
        if payload.numel():
            dist.recv(payload, src)
    except RuntimeError as exc:
        raise PeerLost(_lost(ctx, src, what, exc)) from exc
    return decode_tree(bytes(skeleton.cpu().numpy().tobytes()), payload, ctx.device)


def _lost(ctx: WorkerContext, peer: int, what: str, exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (
        f"rank {ctx.rank}: exchanging {what} with rank {peer} failed (rank {peer} stopped "
        f"answering or failed; faults.timeout_s = {ctx.config.faults.timeout_s:g}): {first}"
    )
