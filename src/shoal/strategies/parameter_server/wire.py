"""The message format between workers and servers: tensors only, a framed header, one payload.

Every request is a header of HEADER_LEN int64s on its own tag::

    [MAGIC, op, sender, seq, clock, fresh, more, entity_rows, relation_rows, values,
     blob_len, END]

followed, if any of its sizes is non-zero, by one payload message (uint8) of exactly
the size the header announces: row ids (int64, entity ids then relation ids), row
values (float32), a byte blob (a checkpoint path), then an 8-byte stamp naming the
header's sender and sequence number. Nothing received is unpickled.

Why this shape: gloo matches a receive with the next message on its tag, and it
can receive a message only into a buffer of at least its size (a longer one aborts
the receiving process inside gloo). So a receiver must know every payload's size
before it posts the receive, and it must receive every payload a header announced
or the next request would read it. The header says the sizes (`values` and
`blob_len` too, whatever the op, so a request with an unknown op can still be read
to its end); MAGIC and END frame the header (a truncated one keeps the zeros it was
received into); the stamp proves the payload belongs to this header (a payload that
was never sent, or a shorter one, leaves a stamp that does not match).

`seq` counts a worker's messages to one server: 1, 2, 3, ... A reply carries the
sequence number of its request. `more` counts the chunks of a push still to come
(0: the push is complete).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import torch

MAGIC = 0x5053_0002  # "PS", format 2
END = 0x2F50_5345_4E44_0002  # "/PSEND", format 2
HEADER_LEN = 12
MAX_BLOB = 1 << 16  # bytes: paths, errors and statistics are small
STAMP_LEN = 8
_STAMP_TAG = 0x5A << 56  # a stamp's top byte: never zero, so a short payload cannot match


class Op(IntEnum):
    PULL = 1  # ids -> reply with their rows
    PUSH = 2  # ids + row gradients; no reply
    BYE = 3  # the worker is done; no reply
    SAVE = 4  # blob: folder to write the shard into -> reply blob: file name and sha256
    SNAPSHOT = 5  # keep a copy of the shard in memory (the best model so far)
    RESTORE = 6  # go back to the best model (the snapshot, else its checkpoint folder)
    STATS = 7  # reply blob: the server's statistics since the last STATS
    REPLY = 8
    ERROR = 9  # reply blob: what was wrong


#: requests a server answers (the others are fire-and-forget)
ANSWERED = frozenset({Op.PULL, Op.SAVE, Op.SNAPSHOT, Op.RESTORE, Op.STATS})
REQUESTS = ANSWERED | {Op.PUSH, Op.BYE}


class Tag(IntEnum):
    HEADER = 1
    PAYLOAD = 2
    REPLY_HEADER = 5
    REPLY_VALUES = 6
    REPLY_BLOB = 7


class WireError(ValueError):
    """A message that breaks the format; the text says what, for the sender's error reply."""


@dataclass(frozen=True)
class Bounds:
    """The most one message may carry; a header announcing more is refused unread."""

    max_rows: int
    max_values: int  # floats: max_rows rows of the widest table

    @classmethod
    def of(cls, max_rows: int, widths: tuple[int, int]) -> Bounds:
        return cls(max_rows, max_rows * max(widths))


#: replies come from a server, which sends what it was asked for
UNBOUNDED = Bounds(1 << 62, 1 << 62)


@dataclass
class Header:
    op: Op
    sender: int
    clock: int
    entity_rows: int = 0
    relation_rows: int = 0
    blob_len: int = 0
    seq: int = 0
    fresh: bool = False
    more: int = 0  # a push's chunks still to come
    values: int = 0  # float32 row values in the payload

    @property
    def rows(self) -> int:
        return self.entity_rows + self.relation_rows

    @property
    def payload_bytes(self) -> int:
        """The size of the payload message that follows (0: none follows)."""
        return payload_bytes(self.rows, self.values, self.blob_len)

    def tensor(self) -> torch.Tensor:
        values = [MAGIC, int(self.op), self.sender, self.seq, self.clock, int(self.fresh)]
        values += [self.more, self.entity_rows, self.relation_rows, self.values, self.blob_len]
        return torch.tensor([*values, END], dtype=torch.int64)

    @classmethod
    def parse(cls, tensor: torch.Tensor, bounds: Bounds) -> Header:
        """Decode a received header: its frame (see `frame`), then its fields."""
        v = frame(tensor, bounds)
        try:
            op = Op(v[1])
        except ValueError:
            raise WireError(f"unknown op {v[1]}") from None
        if v[4] < 0 or v[5] not in (0, 1) or v[6] < 0:
            raise WireError(f"a negative clock or chunk count, or a fresh flag not 0/1 in {v}")
        return cls(op, v[2], v[4], v[7], v[8], v[10], v[3], bool(v[5]), v[6], v[9])


def frame(tensor: torch.Tensor, bounds: Bounds) -> list[int]:
    """The header's fields, if its frame holds: MAGIC first, END last, sizes within `bounds`.

    WireError when it does not; then nothing the header says can be trusted, not even
    whether a payload follows it."""
    v = [int(x) for x in tensor.tolist()]
    if len(v) != HEADER_LEN or v[0] != MAGIC:
        raise WireError(f"not a parameter-server header (magic {v[0]:#x})")
    if v[-1] != END:
        raise WireError(f"a truncated or garbled header (it ends in {v[-1]:#x}, not END)")
    rows, values, blob_len = v[7] + v[8], v[9], v[10]
    if min(v[7], v[8], values, blob_len) < 0:
        raise WireError(f"a negative size in {v}")
    if rows > bounds.max_rows:
        raise WireError(
            f"{rows} rows in one message exceed the bound of {bounds.max_rows} "
            "(strategy.max_message_rows)"
        )
    if values > bounds.max_values:
        raise WireError(f"{values} values in one message exceed the bound of {bounds.max_values}")
    if blob_len > MAX_BLOB:
        raise WireError(f"a blob of {blob_len} bytes exceeds the bound of {MAX_BLOB}")
    return v


def payload_bytes(rows: int, values: int, blob_len: int) -> int:
    if not (rows or values or blob_len):
        return 0
    return 8 * rows + 4 * values + blob_len + STAMP_LEN


def stamp(sender: int, seq: int) -> int:
    """The last 8 bytes of a payload: whose message it belongs to."""
    return _STAMP_TAG | (sender & 0xFFFFFF) << 32 | (seq & 0xFFFFFFFF)


def pack_payload(
    header: Header, ids: torch.Tensor | None, values: torch.Tensor | None, blob: bytes
) -> torch.Tensor:
    """One uint8 tensor: ids, values, blob, stamp (the sizes must be in `header` already)."""
    parts = []
    if ids is not None and ids.numel():
        parts.append(ids.to(torch.int64).contiguous().view(torch.uint8))
    if values is not None and values.numel():
        parts.append(values.to(torch.float32).contiguous().view(torch.uint8))
    if blob:
        parts.append(torch.frombuffer(bytearray(blob), dtype=torch.uint8))
    tail = torch.tensor([stamp(header.sender, header.seq)], dtype=torch.int64)
    parts.append(tail.view(torch.uint8))
    return torch.cat(parts)


def unpack_payload(
    header: Header, payload: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, bytes]:
    """(ids, values, blob): views into `payload`, which is the header's (stamp checked)."""
    ids_end = 8 * header.rows
    values_end = ids_end + 4 * header.values
    ids = payload[:ids_end].view(torch.int64)
    values = payload[ids_end:values_end].view(torch.float32)
    blob = bytes(payload[values_end : values_end + header.blob_len].numpy().tobytes())
    return ids, values, blob


def payload_stamp(payload: torch.Tensor) -> int:
    return int.from_bytes(payload[-STAMP_LEN:].numpy().tobytes(), "little", signed=True)


@dataclass
class Message:
    """One decoded request or reply; `source` is the rank it came from."""

    header: Header
    source: int
    ids: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    values: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    blob: bytes = b""


def decode_json(blob: bytes) -> Any:
    try:
        return json.loads(blob.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"unreadable JSON blob: {exc}") from None
