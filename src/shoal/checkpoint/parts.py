"""The parts a checkpoint is assembled from, each saving and loading itself.

Design (issue 11, item 2; after torchtitan's `CheckpointManager(states={...})`):
a job hands the :class:`~shoal.checkpoint.manager.CheckpointManager` a mapping
``{name: part}``; the manager calls every part's ``state_dict()`` on every rank
(a part may be collective: it gathers what each rank holds alone), keeps rank
0's answers under their names in ``state.pt``, lets every :class:`FilePart`
write its own files into the folder being assembled, hashes every file into
the sealed meta.json and renames the folder into place. On resume the manager
hands each part ``state[name]`` back (:func:`load_parts`), in the order given,
so a part may rely on one loaded before it (the schedule after the optimizer).

The names are the top-level keys of ``state.pt``, the same for every strategy
that holds such a part: ``model``, ``optimizer``, ``scheduler``, ``precision``
(fp16 only), ``progress`` (data position, counters, model selection),
``strategy`` (aggregation residuals, gathered from every rank), ``rng`` (every
rank's generators), ``config``; and for the strategies with state of their own
``server`` (federated server optimizer), ``members`` / ``population`` (the
population's members and book). Files: a parameter server's shards.

Sharded state (issue 12) fits this shape: a collective :class:`FilePart` writes
the DCP folder on every rank, and the `model` / `optimizer` parts keep a marker in
state.pt and read the folder in `load_from` (`sharded.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from shoal.errors import ShoalError
from shoal.runtime.collectives import gather_bytes
from shoal.runtime.context import WorkerContext
from shoal.runtime.rng import capture_rng, restore_rng, seed_everything, worker_seed


@runtime_checkable
class StatePart(Protocol):
    """One piece of a job's state. `state_dict` is called on every rank (it may be
    collective); rank 0's answer is saved. `load_state_dict` runs on every rank."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


class FilePart(Protocol):
    """State kept in files of its own (a parameter server's shards, DCP pieces).

    A part with `collective = True` writes on every rank (each its own pieces, into the
    same folder, which rank 0 prepared): `checkpoint/sharded.py`."""

    def write_files(self, folder: Path) -> dict[str, str]:
        """Rank 0 (or whoever holds them, told by rank 0): write into `folder` before it is
        renamed into place; returns {file name: sha256} of what was written."""
        ...

    def written(self) -> None:
        """Every rank, once rank 0 has written the checkpoint (e.g. meet at a barrier)."""
        ...


class ModelPart:
    """A model's parameters and buffers."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)

    def load_from(self, state: Any, folder: Path) -> None:
        """Also from a checkpoint whose model was saved sharded (`sharded.py`)."""
        from shoal.checkpoint.sharded import load_model

        load_model(self.model, state, folder)


class Fixed:
    """A value that only needs saving (the config, recorded for people and for `changes`)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def state_dict(self) -> Any:
        return self.value

    def load_state_dict(self, state: Any) -> None:
        """Nothing to restore: the run's own config is the one in force."""


class Custom:
    """A part made of two functions, for state that lives in several attributes."""

    def __init__(self, save: Callable[[], Any], load: Callable[[Any], None]) -> None:
        self._save, self._load = save, load

    def state_dict(self) -> Any:
        return self._save()

    def load_state_dict(self, state: Any) -> None:
        self._load(state)


class RankRngs:
    """Every rank's random generators (collective: gathered on rank 0).

    A resume with as many ranks puts each rank's back, so random draws continue as
    if the run never stopped; with another number of ranks each rank reseeds from
    (seed + step, rank) and says that draws now differ.
    """

    def __init__(self, ctx: WorkerContext, reseed: Callable[[], int] | None = None) -> None:
        self.ctx = ctx
        self.reseed = reseed  # the step to reseed from when the world size changed

    def state_dict(self) -> list[torch.Tensor]:
        return [
            torch.frombuffer(bytearray(b), dtype=torch.uint8)
            for b in gather_bytes(self.ctx, capture_rng())
        ]

    def load_state_dict(self, state: list[torch.Tensor]) -> None:
        ctx = self.ctx
        if len(state) == ctx.world_size:
            restore_rng(bytes(state[ctx.rank].numpy().tobytes()))
            return
        if self.reseed is None:
            return
        ctx.log.warning(
            "resuming with %d workers from a checkpoint of %d: training continues correctly "
            "but random draws differ from an uninterrupted run",
            ctx.world_size,
            len(state),
        )
        seed_everything(worker_seed(ctx.config.train.seed + self.reseed(), ctx.rank))


class TaskFiles:
    """The files a task writes into every checkpoint folder (an lm task's tokenizer)."""

    def __init__(self, write: Callable[[Path], dict[str, str]]) -> None:
        self.write = write

    def write_files(self, folder: Path) -> dict[str, str]:
        return self.write(folder)

    def written(self) -> None:
        """Nothing to wait for: rank 0 wrote them itself."""


def collect(parts: Mapping[str, StatePart], is_main: bool) -> dict[str, Any]:
    """Every part's state (every rank calls every part, in order); rank 0 keeps them."""
    state = {name: part.state_dict() for name, part in parts.items()}
    return state if is_main else {}


def load_parts(
    state: Mapping[str, Any],
    parts: Mapping[str, StatePart],
    path: Path,
    optional: tuple[str, ...] = (),
) -> None:
    """Hand each part its saved state, in the order of `parts`.

    A part missing from the checkpoint is an error naming it, unless it is `optional`
    (state a run may or may not have had, e.g. aggregation residuals). A part that
    reads files of the checkpoint as well (sharded state) has `load_from(state, path)`.
    """
    for name, part in parts.items():
        if name in state:
            load_from = getattr(part, "load_from", None)
            if load_from is not None:
                load_from(state[name], path)
            else:
                part.load_state_dict(state[name])
        elif name not in optional:
            raise ShoalError(
                f"{path}: the checkpoint has no {name!r} state (it holds: "
                f"{', '.join(sorted(state))}); resume it with the strategy that wrote it"
            )
