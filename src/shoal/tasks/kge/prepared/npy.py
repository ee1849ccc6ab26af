"""Arrays written to .npy files a block at a time, so no whole array is ever in memory.

The files are plain NumPy (`numpy.load(path, mmap_mode="r")` reads them, with or
without shoal). The header is written last, in space reserved at the start, since
the number of rows is known only once every block has been appended.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from types import TracebackType

import numpy as np

HEADER_BYTES = 128  # magic, version, length and the dict, padded; a multiple of 64
_MAGIC = b"\x93NUMPY\x01\x00"


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """A version 1.0 header of exactly HEADER_BYTES bytes."""
    fields = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    text = repr(fields)
    length = HEADER_BYTES - len(_MAGIC) - 2
    if len(text) + 1 > length:
        raise ValueError(f"npy header too long for shape {shape}")
    body = (text.ljust(length - 1) + "\n").encode("latin1")
    return _MAGIC + length.to_bytes(2, "little") + body


class NpyWriter:
    """Appends rows of one dtype and row shape to an .npy file; `close()` writes the header."""

    def __init__(self, path: Path, dtype: type | np.dtype, row_shape: tuple[int, ...] = ()) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.row_shape = row_shape
        self.rows = 0
        self._file = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._file.write(b"\0" * HEADER_BYTES)

    def append(self, block: np.ndarray) -> None:
        block = np.ascontiguousarray(block, dtype=self.dtype)
        if block.shape[1:] != self.row_shape:
            raise ValueError(
                f"{self.path.name}: rows of shape {block.shape[1:]}, not {self.row_shape}"
            )
        self._file.write(block.tobytes())
        self.rows += len(block)

    def close(self) -> None:
        if self._file.closed:
            return
        self._file.seek(0)
        self._file.write(npy_header(self.dtype, (self.rows, *self.row_shape)))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()

    def __enter__(self) -> NpyWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def save_npy(path: Path, array: np.ndarray) -> None:
    """A whole (small) array, through the same writer."""
    with NpyWriter(path, array.dtype, array.shape[1:]) as writer:
        writer.append(array)


def open_npy(path: Path, random_access: bool = False) -> np.ndarray:
    """A memory map of an .npy file, copy-on-write: writable in this process only (torch
    wraps it without a warning), the file never changed. `random_access` tells the kernel
    to read only the pages touched (no read-around: a batch's random rows each fault in
    their own page, not 128 KiB around it)."""
    with open(path, "rb") as handle:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(handle)
        else:
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(handle)
        if fortran_order or dtype.hasobject:
            raise ValueError(f"{path}: not a C-ordered array of numbers")
        offset = handle.tell()
        count = int(np.prod(shape))
        if count == 0:
            return np.zeros(shape, dtype=dtype)
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    if random_access and hasattr(mmap, "MADV_RANDOM"):
        mapped.madvise(mmap.MADV_RANDOM)
    return np.frombuffer(mapped, dtype=dtype, count=count, offset=offset).reshape(shape)


def row_blocks(array: np.ndarray, rows: int) -> list[slice]:
    """Slices of at most `rows` rows covering `array`."""
    return [slice(start, min(start + rows, len(array))) for start in range(0, len(array), rows)]
