"""Character- and byte-level tokenizers, built from the text itself: nothing is downloaded.

A char tokenizer's vocabulary is the sorted set of characters of the task's text
files, so ids depend on those files alone. It is written to the run directory
(`tokenizer.json`) and into every checkpoint, and a resumed run or `shoal generate`
reads it back from there instead of rebuilding it: if the file changed in between,
the ids of the model still mean what they meant in training, and a character the
model never saw is an error at its file:line rather than a silently shifted id.

A byte tokenizer has the 256 byte values as its vocabulary; any text encodes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shoal.checkpoint.atomic import atomic_write_bytes
from shoal.errors import ShoalError

TOKENIZER_FILE = "tokenizer.json"
#: characters tokenized at a time (bounds the temporaries of building and encoding)
CHUNK_CHARS = 1 << 20


class UnknownCharacter(ValueError):
    """A character outside a char tokenizer's vocabulary, at `position` of the text."""

    def __init__(self, char: str, position: int) -> None:
        super().__init__(f"character {char!r} is not in the vocabulary")
        self.char = char
        self.position = position


@dataclass(frozen=True)
class Tokenizer:
    """Text <-> token ids. `chars` is the vocabulary of a char tokenizer ('' for bytes)."""

    kind: str  # "char" | "byte"
    chars: str = ""

    @classmethod
    def build(cls, kind: str, texts: list[str]) -> Tokenizer:
        """The tokenizer of `kind` for these texts (a char vocabulary: every character in them)."""
        if kind == "byte":
            return cls("byte")
        seen = np.zeros(0, dtype=np.uint32)
        for text in texts:
            for start in range(0, len(text), CHUNK_CHARS):
                chunk = np.unique(_code_points(text[start : start + CHUNK_CHARS]))
                seen = np.union1d(seen, chunk)
        return cls("char", "".join(map(chr, seen.tolist())))

    @property
    def vocab_size(self) -> int:
        return 256 if self.kind == "byte" else len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int32). Raises UnknownCharacter for a character outside the vocabulary.

        A chunk of the text at a time: the lookup's temporaries (UTF-32 codes, int64
        indices) cost some 25 bytes a character, which for a whole 220 MB text was 5 GB
        before the first step; chunked, the ids (4 bytes a token) are most of it."""
        if self.kind == "byte":
            parts = [
                np.frombuffer(text[start : start + CHUNK_CHARS].encode("utf-8"), np.uint8)
                for start in range(0, len(text), CHUNK_CHARS)
            ]
            return np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)
        ids = np.empty(len(text), dtype=np.int32)
        vocab = _code_points(self.chars)
        for start in range(0, len(text), CHUNK_CHARS):
            ids[start : start + CHUNK_CHARS] = self._encode_chars(
                text[start : start + CHUNK_CHARS], vocab, start
            )
        return ids

    @staticmethod
    def _encode_chars(text: str, vocab: np.ndarray, offset: int) -> np.ndarray:
        codes = _code_points(text)
        if len(vocab) == 0:
            if len(codes):
                raise UnknownCharacter(text[0], offset)
            return np.zeros(0, dtype=np.int32)
        ids = np.searchsorted(vocab, codes)
        unknown = np.flatnonzero(vocab[np.minimum(ids, len(vocab) - 1)] != codes)
        if len(unknown):
            raise UnknownCharacter(text[int(unknown[0])], offset + int(unknown[0]))
        return ids.astype(np.int32)

    def decode(self, ids: list[int]) -> str:
        if self.kind == "byte":
            return bytes(ids).decode("utf-8", errors="replace")
        return "".join(self.chars[i] for i in ids)

    # ------------------------------------------------------------ persistence
    def to_json(self) -> bytes:
        payload = {"kind": self.kind, "vocab_size": self.vocab_size}
        if self.kind == "char":
            payload["chars"] = self.chars
        return (json.dumps(payload, ensure_ascii=True) + "\n").encode()

    def save(self, path: Path) -> str:
        """Write atomically; returns the file's sha256 (checkpoints verify it)."""
        data = self.to_json()
        atomic_write_bytes(path, data)
        return hashlib.sha256(data).hexdigest()

    @classmethod
    def load(cls, path: Path) -> Tokenizer:
        try:
            payload = json.loads(path.read_text())
            kind = payload["kind"]
            tokenizer = cls(kind, payload.get("chars", "")) if kind in ("char", "byte") else None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ShoalError(f"{path}: unreadable tokenizer: {exc}") from None
        if tokenizer is None or tokenizer.vocab_size != payload.get("vocab_size"):
            raise ShoalError(f"{path}: not a shoal tokenizer (kind char or byte, with vocab_size)")
        return tokenizer


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
