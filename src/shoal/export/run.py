"""`export_run`: the checkpoint picked, its model read and checked, the files written."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from shoal.errors import ShoalError
from shoal.export.model import check_fits, is_pretrained, run_model, tied_names, user_names
from shoal.export.source import SavedModel, pick_checkpoint, read_model
from shoal.export.write import place, refuse_existing, save_hf_folder, save_safetensors

Format = Literal["safetensors", "hf"]
FORMATS: tuple[Format, ...] = ("safetensors", "hf")


@dataclass
class Exported:
    """What an export wrote, for the line the CLI prints."""

    path: Path
    format: Format
    checkpoint: Path
    step: int
    tensors: int
    bytes: int


def export_run(
    run_dir: str | Path,
    out: str | Path | None = None,
    format: Format | None = None,
    checkpoint: str | None = None,
) -> Exported:
    """Write the model of run `run_dir`'s best checkpoint (or `checkpoint`: latest, step-N, a
    folder) to `out` (default: RUN/export/<step-N>[.safetensors]), as one safetensors file or
    a Hugging Face folder (`format`; default hf for a `PreTrainedModel`, else safetensors)."""
    if format is not None and format not in FORMATS:
        raise ShoalError(f"--format {format}: choose {' or '.join(FORMATS)}")
    run = Path(run_dir)
    if out is not None:
        refuse_existing(Path(out))  # before a large checkpoint is read (place checks again)
    saved = read_model(pick_checkpoint(run, checkpoint))
    model = run_model(saved)
    tied = tied_names(model) if model is not None else {}
    if model is not None:
        check_fits(saved, model, tied)
    hf = is_pretrained(model)
    chosen: Format = format or ("hf" if hf else "safetensors")
    if chosen == "hf" and not hf:
        raise ShoalError(f"--format hf: {_what(saved, model)}; export it with --format safetensors")
    target = Path(out) if out is not None else _default_out(run, saved, chosen)
    provenance = _provenance(run, saved)
    state = user_names(saved.state, model)
    what = f"export of {saved.checkpoint}"
    if chosen == "hf":
        assert model is not None
        place(target, save_hf_folder(model, state, tied, provenance), what)
    else:
        place(target, save_safetensors(state, tied, provenance), what)
    size = sum(t.numel() * t.element_size() for t in saved.state.values())
    return Exported(target, chosen, saved.checkpoint, saved.step, len(state), size)


def _what(saved: SavedModel, model: object) -> str:
    if model is None:
        kind = saved.config.get("task", {}).get("type")
        return f"the run trained shoal's own {kind} model, not a Hugging Face PreTrainedModel"
    return f"the run's model is a {type(model).__name__}, not a Hugging Face PreTrainedModel"


def _default_out(run: Path, saved: SavedModel, chosen: Format) -> Path:
    name = saved.checkpoint.name
    return run / "export" / (name if chosen == "hf" else f"{name}.safetensors")


def _provenance(run: Path, saved: SavedModel) -> dict[str, str]:
    from shoal import __version__

    return {
        "shoal.run": str(run.resolve()),
        "shoal.checkpoint": str(saved.checkpoint.resolve()),
        "shoal.step": str(saved.step),
        "shoal.strategy": str(saved.config.get("strategy", {}).get("type")),
        "shoal.version": __version__,
    }
