"""Reading a text file in blocks: gzip read as gzip.GzipFile reads it (several members,
padding, bounded pieces), damage refused in one line, the read-ahead thread gone when
the reader stops."""

from __future__ import annotations

import gzip
import threading
from pathlib import Path

import pytest

from shoal import textfile
from shoal.errors import DataError
from shoal.textfile import text_blocks

EXPECTED = "expected head<TAB>relation<TAB>tail lines"


def _lines(first: int, count: int) -> bytes:
    return "".join(f"e{i}\tr{i % 7}\te{i + 1}\n" for i in range(first, first + count)).encode()


def _text(path: Path, block_bytes: int = 256) -> bytes:
    blocks = list(text_blocks(path, EXPECTED, block_bytes))
    lines = 1
    for block in blocks:  # every block starts at the line it says
        assert block.first_line == lines and block.data.endswith(b"\n")
        lines += block.data.count(b"\n")
    return b"".join(block.data for block in blocks)


def _readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "shoal-read-ahead"]


@pytest.mark.parametrize("block_bytes", [64, 256, 1 << 20])
def test_several_gzip_members_and_zero_padding_read_as_one_text(
    tmp_path: Path, block_bytes: int
) -> None:
    """`cat a.gz b.gz` is one gzip file of two members; tar and some tools pad with zeros."""
    parts = [_lines(0, 40), _lines(40, 1), _lines(41, 300)]
    packed = gzip.compress(parts[0]) + gzip.compress(parts[1]) + b"\x00" * 700
    packed += gzip.compress(parts[2], mtime=0) + b"\x00" * 3
    path = tmp_path / "train.txt.gz"
    path.write_bytes(packed)
    assert gzip.decompress(packed) == b"".join(parts)  # what GzipFile reads
    assert _text(path, block_bytes) == b"".join(parts)


def test_a_text_far_larger_than_its_gzip_comes_in_bounded_blocks(tmp_path: Path) -> None:
    text = b"a\tb\tc\n" * 2_000_000  # 12 MB that compress to a few kB
    path = tmp_path / "train.txt.gz"
    path.write_bytes(gzip.compress(text))
    sizes = [len(block.data) for block in text_blocks(path, EXPECTED, 1 << 20)]
    assert sum(sizes) == len(text)
    assert max(sizes) <= (1 << 20) + textfile.READ_BYTES


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda packed: packed[: len(packed) // 2], "Compressed file ended before"),
        (lambda packed: packed[:-8] + b"\x00\x00\x00\x00" + packed[-4:], "incorrect data check"),
        (lambda packed: packed + b"garbage after the member", "incorrect header check"),
        (lambda packed: packed[:10] + b"\xff" * 40 + packed[50:], "while decompressing"),
    ],
    ids=["truncated", "wrong-crc", "garbage-after", "corrupt"],
)
def test_a_damaged_gzip_file_is_one_line_naming_the_file(
    tmp_path: Path, damage: object, says: str
) -> None:
    path = tmp_path / "train.txt.gz"
    path.write_bytes(damage(gzip.compress(_lines(0, 5000))))  # type: ignore[operator]
    with pytest.raises(DataError) as caught:
        _text(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: not a readable gzip file: ") and says in message
    assert "\n" not in message


def test_a_problem_in_a_later_block_comes_after_the_blocks_before_it(tmp_path: Path) -> None:
    """The thread reads ahead, but a bad line is raised when its block is reached."""
    text = _lines(0, 200) + b"a\x00\tr\tb\n" + _lines(200, 10)
    path = tmp_path / "train.txt.gz"
    path.write_bytes(gzip.compress(text))
    received = []
    with pytest.raises(DataError, match=r"train.txt.gz:201: binary data"):
        for block in text_blocks(path, EXPECTED, 256):
            received.append(block.data)
    before = b"".join(received)  # whole blocks, up to the one with the bad line
    assert text.startswith(before) and 0 < len(before) <= text.index(b"a\x00") < len(before) + 512


def test_the_reader_thread_ends_when_the_reader_stops_early(tmp_path: Path) -> None:
    path = tmp_path / "train.txt"
    path.write_bytes(_lines(0, 20_000))
    blocks = text_blocks(path, EXPECTED, 256)
    next(blocks)
    assert len(_readers()) == 1
    blocks.close()
    assert _readers() == []
    with pytest.raises(RuntimeError, match="stop"):  # the caller fails mid-file
        for _block in text_blocks(path, EXPECTED, 256):
            raise RuntimeError("stop")
    assert _readers() == []
