"""Reading a user's text file once, for every text format shoal accepts.

Every text input (CSV samples, triples, a sharding file) goes through
:func:`read_text`, so each gets the same tolerance and the same one-line errors:

- gzip is detected by its magic bytes, whatever the file is called;
- a UTF-8 byte-order mark at the start is dropped. Excel and Notepad write one;
  kept, it becomes part of the first column name or the first label (`\\ufeffhead`
  is another entity than `head`, and no `str.strip` removes it). A mark anywhere
  else (files concatenated with `cat`) is an error at its line;
- bytes that are not UTF-8, or a NUL (binary data), stop the read at the exact
  line, with the byte, before anything is parsed.

:func:`text_blocks` reads the same way in blocks of whole lines, for files too large
to hold at once (a knowledge graph's triples); each block is checked as it is read.
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from shoal.errors import DataError

GZIP_MAGIC = b"\x1f\x8b"
BOM = "\ufeff"
BOM_BYTES = BOM.encode()


def read_text(path: Path, expected: str) -> str:
    """The file's text; `expected` (e.g. "expected head<TAB>relation<TAB>tail lines")
    ends every error message, to say what the file should have been."""
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory; {expected}") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror}") from None
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError(f"{path}: not a readable gzip file: {exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); {expected}"
        ) from None
    text = text.removeprefix(BOM)
    for char, what in (("\x00", "binary data (a NUL byte)"), (BOM, "a byte-order mark")):
        at = text.find(char)
        if at >= 0:
            line = text.count("\n", 0, at) + 1
            hint = "" if char == "\x00" else " inside the file (files joined together?)"
            raise DataError(f"{path}:{line}: {what}{hint}; {expected}")
    return text


@dataclass
class TextBlock:
    """Whole lines of a file (each ending in a newline) and the number of the first."""

    data: bytes
    first_line: int
    #: bytes of the file read so far (compressed bytes for a gzip file): progress
    consumed: int


class _HashingReader:
    """A file's raw bytes, hashed as they are read (the file's sha256, with no second read)."""

    def __init__(self, raw: BinaryIO, digest: hashlib._Hash | None) -> None:
        self.raw = raw
        self.digest = digest

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        if self.digest is not None:
            self.digest.update(data)
        return data

    def tell(self) -> int:
        return self.raw.tell()


def text_blocks(
    path: Path,
    expected: str,
    block_bytes: int = 8 << 20,
    digest: hashlib._Hash | None = None,
) -> Iterator[TextBlock]:
    """The file in blocks of about `block_bytes` of whole lines, checked as :func:`read_text`
    checks a whole file (a problem is raised when the block that holds it is read).
    `digest`, if given, is updated with the file's bytes as stored (its sha256 on disk)."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed below, whatever happens
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory; {expected}") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror}") from None
    with raw:
        hashing = _HashingReader(raw, digest)
        magic = raw.read(2)
        raw.seek(0)
        source: _HashingReader | gzip.GzipFile = hashing
        if magic == GZIP_MAGIC:
            source = gzip.GzipFile(fileobj=hashing, mode="rb")  # type: ignore[call-overload]
        yield from _blocks(path, expected, source, hashing, block_bytes)


def _blocks(
    path: Path,
    expected: str,
    source: _HashingReader | gzip.GzipFile,
    raw: _HashingReader,
    block_bytes: int,
) -> Iterator[TextBlock]:
    line = 1
    carry = b""
    first = True
    while True:
        try:
            chunk = source.read(block_bytes)
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError(f"{path}: not a readable gzip file: {exc}") from None
        data = carry + chunk
        if first:
            data = data.removeprefix(BOM_BYTES)
            first = False
        if not chunk:  # the end: the last line may lack its newline
            if data:
                yield _checked(path, expected, data + b"\n", line, raw.tell())
            return
        cut = data.rfind(b"\n") + 1
        carry = data[cut:]
        if cut:
            yield _checked(path, expected, data[:cut], line, raw.tell())
            line += data.count(b"\n", 0, cut)


def _checked(path: Path, expected: str, data: bytes, first_line: int, consumed: int) -> TextBlock:
    """The block, after read_text's checks: UTF-8, then no NUL, then no byte-order mark."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = first_line + data.count(b"\n", 0, exc.start)
        raise DataError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); {expected}"
        ) from None
    for mark, what in ((b"\x00", "binary data (a NUL byte)"), (BOM_BYTES, "a byte-order mark")):
        at = data.find(mark)
        if at >= 0:
            line = first_line + data.count(b"\n", 0, at)
            hint = "" if mark == b"\x00" else " inside the file (files joined together?)"
            raise DataError(f"{path}:{line}: {what}{hint}; {expected}")
    return TextBlock(data, first_line, consumed)


def text_size(path: Path) -> int:
    """The size of a text file, uncompressed: a gzip file's last 4 bytes hold it (modulo
    4 GiB; the compressed size times 4 if that reads smaller)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as file:
            if file.read(2) != b"\x1f\x8b" or size < 18:
                return size
            file.seek(-4, 2)
            return max(int.from_bytes(file.read(4), "little"), 4 * size)
    except OSError:
        return 0
