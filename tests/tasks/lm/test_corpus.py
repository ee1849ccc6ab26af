"""Tokenizers, the split, training windows per epoch and validation windows."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

from shoal.errors import DataError, ShoalError
from shoal.tasks.lm.config import LMTaskConfig
from shoal.tasks.lm.corpus import TrainWindows, eval_windows, load_corpus
from shoal.tasks.lm.tokenizer import Tokenizer, UnknownCharacter


def _config(train: Path, **data: object) -> LMTaskConfig:
    return LMTaskConfig.model_validate({"type": "lm", "data": {"train": str(train), **data}})


def test_char_tokenizer_round_trip_and_sorted_vocabulary() -> None:
    text = "héllo, wörld\n"
    tokenizer = Tokenizer.build("char", [text])
    assert tokenizer.chars == "".join(sorted(set(text)))
    ids = tokenizer.encode(text)
    assert ids.dtype.name == "int32" and tokenizer.decode(ids.tolist()) == text
    with pytest.raises(UnknownCharacter) as caught:
        tokenizer.encode("héllo!")
    assert (caught.value.char, caught.value.position) == ("!", 5)


def test_byte_tokenizer_encodes_any_text() -> None:
    tokenizer = Tokenizer.build("byte", ["ignored"])
    ids = tokenizer.encode("é€")
    assert tokenizer.vocab_size == 256 and ids.tolist() == list("é€".encode())
    assert tokenizer.decode(ids.tolist()) == "é€"


def test_tokenizer_saved_and_loaded(tmp_path: Path) -> None:
    tokenizer = Tokenizer.build("char", ['a"b\\c\n\u2028'])
    tokenizer.save(tmp_path / "t.json")
    assert Tokenizer.load(tmp_path / "t.json") == tokenizer
    (tmp_path / "bad.json").write_text('{"kind": "word"}')
    with pytest.raises(ShoalError, match=r"bad\.json: not a shoal tokenizer"):
        Tokenizer.load(tmp_path / "bad.json")


def test_split_takes_the_end_for_validation(tmp_path: Path) -> None:
    text = "abcdefghij" * 10
    path = tmp_path / "t.txt.gz"
    path.write_bytes(gzip.compress(text.encode()))  # gzip read transparently
    corpus = load_corpus(_config(path, split=0.7))
    assert len(corpus.train) == 70 and corpus.valid is not None and len(corpus.valid) == 30
    assert corpus.tokenizer.decode(corpus.valid.tolist()) == text[70:]
    default = load_corpus(_config(path))
    assert len(default.train) == 90, "the customary 90% by default"
    assert load_corpus(_config(path, split=1.0)).valid is None


def test_separate_valid_file_joins_the_vocabulary(tmp_path: Path) -> None:
    (tmp_path / "train.txt").write_text("aaaa bbbb")
    (tmp_path / "valid.txt").write_text("abz")
    corpus = load_corpus(_config(tmp_path / "train.txt", valid=str(tmp_path / "valid.txt")))
    assert corpus.tokenizer.chars == " abz" and len(corpus.train) == 9


def test_saved_tokenizer_rejects_new_characters_at_their_line(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("abc\nabc\nab#\n")
    saved = Tokenizer.build("char", ["abc\n"])
    with pytest.raises(DataError) as caught:
        load_corpus(_config(path), saved)
    assert str(caught.value).startswith(f"{path}:3: character '#' is not in this run's vocabulary")
    with pytest.raises(ShoalError, match=r"task\.tokenizer: this run was trained with the char"):
        load_corpus(_config(path, split=0.5).model_copy(update={"tokenizer": "byte"}), saved)


def test_windows_tile_the_text_and_move_with_the_epoch() -> None:
    tokens = torch.arange(1000, dtype=torch.int32)
    windows = TrainWindows(tokens, context=16, seed=3, source="t")
    assert windows.count == 999 // 16 - 1
    offsets = set()
    for epoch in range(6):
        windows.set_epoch(epoch)
        batch = windows.fetch(torch.arange(windows.count))
        assert batch.shape == (windows.count, 17) and batch.dtype == torch.int64
        targets = batch[:, 1:].reshape(-1)
        assert len(set(targets.tolist())) == targets.numel(), "every token a target at most once"
        assert int(batch[-1, -1]) <= 999
        assert torch.equal(batch[1:, 0], batch[:-1, -1]), "windows overlap by one token"
        offsets.add(int(batch[0, 0]))
        again = TrainWindows(tokens, context=16, seed=3, source="t")
        again.set_epoch(epoch)
        assert torch.equal(again.fetch(torch.tensor([5, 2])), batch[[5, 2]]), "deterministic"
    assert len(offsets) > 1, "window borders move between epochs"


def test_text_shorter_than_a_window_is_an_error() -> None:
    with pytest.raises(ShoalError, match=r"task.data.train: 10 training tokens, fewer than one"):
        TrainWindows(
            torch.zeros(10, dtype=torch.int32), context=16, seed=0, source="task.data.train"
        )
    assert TrainWindows(torch.zeros(17, dtype=torch.int32), 16, 0, "t").count == 1


def test_eval_windows_predict_every_token_once() -> None:
    windows = eval_windows(100, 16)
    assert windows[-1] == (96, 3) and all(n == 16 for _, n in windows[:-1])
    assert sum(n for _, n in windows) == 99
    assert eval_windows(100, 16, limit=2) == [(0, 16), (16, 16)]


def test_chunked_tokenizing_gives_the_same_ids_and_positions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chunks of 7 characters: the vocabulary, the ids and an unknown character's position
    are those of the whole text at once."""
    import shoal.tasks.lm.tokenizer as tokenizer

    text = "To be, or not to be: that is the question. Ünïcödé ✓\n" * 3
    whole = Tokenizer.build("char", [text])
    expected = whole.encode(text)
    monkeypatch.setattr(tokenizer, "CHUNK_CHARS", 7)
    chunked = Tokenizer.build("char", [text])
    assert chunked == whole
    assert chunked.encode(text).tolist() == expected.tolist()
    assert Tokenizer("byte").encode(text).tolist() == list(text.encode("utf-8"))
    with pytest.raises(UnknownCharacter) as unknown:
        chunked.encode(text[:30] + "@" + text)
    assert unknown.value.position == 30


def test_tokenizing_a_large_text_costs_a_few_bytes_a_character() -> None:
    """32 MB of text: building the vocabulary and encoding it peak at well under 10 bytes a
    character beyond the text (it was some 25: a 220 MB corpus needed 5 GB before step 1)."""
    import tracemalloc

    text = ("the quick brown fox jumps over the lazy dog; " * 800_000)[: 32 << 20]
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        ids = Tokenizer.build("char", [text]).encode(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(ids) == len(text)
    assert peak < 6 * len(text), f"{peak / len(text):.1f} bytes a character"
