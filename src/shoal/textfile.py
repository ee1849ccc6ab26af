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
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from shoal.errors import DataError

GZIP_MAGIC = b"\x1f\x8b"
BOM = "\ufeff"


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
