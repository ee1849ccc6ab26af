"""Names written a block at a time read back as they were, whatever characters they hold."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shoal.tasks.kge.prepared.names import Names, names_files, write_names


def test_names_read_back_as_written(tmp_path: Path) -> None:
    blocks = [["a", "Zürich", "", "東京 x"], [], ["with\nnewline", "b"], ["😀"]]
    assert write_names(tmp_path, "entity", blocks) == 7
    data_name, offsets_name = names_files("entity")
    names = Names(
        np.frombuffer((tmp_path / data_name).read_bytes(), dtype=np.uint8),
        np.load(tmp_path / offsets_name),
    )
    assert list(names) == [name for block in blocks for name in block]
