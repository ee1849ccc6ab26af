"""The message format between workers and servers: tensors only, fixed-layout header.

Every message starts with a header of HEADER_LEN int64s::

    [MAGIC, op, sender, clock, entity_rows, relation_rows, blob_len, seq]

followed, per op, by payload tensors on their own tags: row ids (int64, entity
ids then relation ids), row values (float32, rows x width, entities first) and
a byte blob (uint8, JSON or UTF-8: a checkpoint path, an error, statistics).
Nothing received is unpickled. A receiver knows every payload's size from the
header before it posts the receive, and rejects a header whose sizes exceed the
configured bounds, so a malformed or hostile message costs one error reply,
never an unbounded allocation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import torch

MAGIC = 0x5053_0001  # "PS", format 1
HEADER_LEN = 8
MAX_BLOB = 1 << 16  # bytes: paths, errors and statistics are small


class Op(IntEnum):
    PULL = 1  # ids -> reply with their rows
    PUSH = 2  # ids + row gradients; no reply
    BYE = 3  # the worker is done; no reply
    SAVE = 4  # blob: folder to write the shard into -> reply blob: file name and sha256
    SNAPSHOT = 5  # keep a copy of the shard in memory (the best model so far)
    RESTORE = 6  # go back to the snapshot
    STATS = 7  # reply blob: the server's statistics since the last STATS
    REPLY = 8
    ERROR = 9  # reply blob: what was wrong


#: requests a server answers (the others are fire-and-forget)
ANSWERED = frozenset({Op.PULL, Op.SAVE, Op.SNAPSHOT, Op.RESTORE, Op.STATS})
#: requests that wait until every worker's pushes up to their clock are applied, whatever
#: the mode: evaluation pulls, checkpoints and snapshots see a consistent table
FRESH_FLAG = 1 << 62


class Tag(IntEnum):
    HEADER = 1
    IDS = 2
    VALUES = 3
    BLOB = 4
    REPLY_HEADER = 5
    REPLY_VALUES = 6
    REPLY_BLOB = 7


class WireError(ValueError):
    """A message that breaks the format; the text says what, for the sender's error reply."""


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

    @property
    def rows(self) -> int:
        return self.entity_rows + self.relation_rows

    def tensor(self) -> torch.Tensor:
        clock = self.clock | (FRESH_FLAG if self.fresh else 0)
        values = [MAGIC, int(self.op), self.sender, clock]
        values += [self.entity_rows, self.relation_rows, self.blob_len, self.seq]
        return torch.tensor(values, dtype=torch.int64)

    @classmethod
    def parse(cls, tensor: torch.Tensor, max_rows: int) -> Header:
        """Decode and bound-check a received header; WireError says what is wrong."""
        v = [int(x) for x in tensor.tolist()]
        if len(v) != HEADER_LEN or v[0] != MAGIC:
            raise WireError(f"not a parameter-server header (magic {v[0]:#x})")
        try:
            op = Op(v[1])
        except ValueError:
            raise WireError(f"unknown op {v[1]}") from None
        clock, fresh = v[3] & ~FRESH_FLAG, bool(v[3] & FRESH_FLAG)
        header = cls(op, v[2], clock, v[4], v[5], v[6], v[7], fresh)
        if clock < 0 or header.entity_rows < 0 or header.relation_rows < 0:
            raise WireError(f"negative clock or row count in {v}")
        if header.rows > max_rows:
            raise WireError(
                f"{header.rows} rows in one message exceed the bound of {max_rows} "
                "(strategy.max_message_rows)"
            )
        if not 0 <= header.blob_len <= MAX_BLOB:
            raise WireError(f"a blob of {header.blob_len} bytes exceeds the bound of {MAX_BLOB}")
        return header


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
