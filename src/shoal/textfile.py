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
import queue
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

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

    def __init__(self, path: Path, raw: BinaryIO, digest: hashlib._Hash | None) -> None:
        self.path = path
        self.raw = raw
        self.digest = digest

    def read(self, size: int = -1) -> bytes:
        try:
            data = self.raw.read(size)
        except OSError as exc:
            raise DataError(f"{self.path}: cannot read: {exc.strerror}") from None
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
    `digest`, if given, is updated with the file's bytes as stored (its sha256 on disk).

    The next block is read, hashed and decompressed in a thread while the caller works on
    the current one: reading, sha256 and zlib release the GIL, so on two cores a gzip
    file's decompression costs the caller almost nothing. At most two blocks wait ahead."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed below, whatever happens
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory; {expected}") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror}") from None
    with raw:
        hashing = _HashingReader(path, raw, digest)
        magic = raw.read(2)
        raw.seek(0)
        piece = min(block_bytes, READ_BYTES)
        pieces = _inflated(path, hashing, piece) if magic == GZIP_MAGIC else _stored(hashing, piece)
        yield from _read_ahead(_blocks(path, expected, pieces, block_bytes))


#: bytes read (and text inflated) at once, at most; blocks are made of such pieces
READ_BYTES = 1 << 20
#: how long the reader thread's hand-over waits before looking whether the other side quit
_POLL_S = 0.5

T = TypeVar("T")


def _read_ahead(items: Iterator[T]) -> Iterator[T]:
    """`items`, each made in a thread while the caller works on the one before (the thread
    keeps at most one finished item waiting). An exception of `items` is raised here; when
    the caller stops early, the thread stops after the item it is making."""
    handover: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def hand_over(item: tuple[bool, Any]) -> bool:
        while not stop.is_set():
            try:
                handover.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not hand_over((True, item)):
                    return
            hand_over((False, None))
        except BaseException as exc:  # handed to the caller, raised there
            hand_over((False, exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="shoal-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            try:
                more, value = handover.get(timeout=_POLL_S)
            except queue.Empty:
                if not thread.is_alive() and handover.empty():
                    raise RuntimeError("the read-ahead thread ended without a word") from None
                continue
            if not more:
                if value is not None:
                    raise value
                return
            yield value
    finally:
        stop.set()
        thread.join()


def _stored(raw: _HashingReader, size: int) -> Iterator[tuple[bytes, int]]:
    """A plain file's bytes in pieces of `size`, with the bytes read so far."""
    while chunk := raw.read(size):
        yield chunk, raw.tell()


def _inflated(path: Path, raw: _HashingReader, size: int) -> Iterator[tuple[bytes, int]]:
    """A gzip file's text in pieces of at most `size` (a small file may inflate to a huge
    text), with the compressed bytes read so far, as gzip.GzipFile reads it: every member
    in turn (`cat a.gz b.gz > c.gz`), zero bytes after a member skipped, each member's CRC
    and length checked; a truncated or corrupt file is a DataError."""
    inflate = zlib.decompressobj(wbits=31)  # 31: a gzip header and trailer
    pending, started = b"", False
    try:
        while True:
            if not pending:
                pending = raw.read(size)
                if not pending:
                    break
            if inflate.eof:  # between members: padding, then the next one
                pending = pending.lstrip(b"\x00")
                if not pending:
                    continue
                inflate, started = zlib.decompressobj(wbits=31), False
            text = inflate.decompress(pending, size)
            started = True
            pending = inflate.unused_data if inflate.eof else inflate.unconsumed_tail
            if text:
                yield text, raw.tell()
        if started and not inflate.eof:
            rest = inflate.flush()  # output zlib held back at the limit, if any
            if rest:
                yield rest, raw.tell()
            if not inflate.eof:
                raise EOFError("Compressed file ended before the end-of-stream marker was reached")
    except (EOFError, zlib.error) as exc:
        raise DataError(f"{path}: not a readable gzip file: {exc}") from None


def _blocks(
    path: Path, expected: str, pieces: Iterator[tuple[bytes, int]], block_bytes: int
) -> Iterator[TextBlock]:
    """Whole lines of about `block_bytes` out of the file's text `pieces`."""
    line = 1
    first = True
    parts: list[bytes] = []
    size = 0
    consumed = 0
    for piece, consumed in pieces:
        parts.append(piece)
        size += len(piece)
        if size < block_bytes:
            continue
        data = b"".join(parts)
        if first:
            data = data.removeprefix(BOM_BYTES)
            first = False
        cut = data.rfind(b"\n") + 1
        parts, size = [data[cut:]], len(data) - cut
        if cut:
            yield _checked(path, expected, data[:cut], line, consumed)
            line += data.count(b"\n", 0, cut)
    data = b"".join(parts)
    if first:
        data = data.removeprefix(BOM_BYTES)
    if data:  # the end: the last line may lack its newline
        if not data.endswith(b"\n"):
            data += b"\n"
        yield _checked(path, expected, data, line, consumed)


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
