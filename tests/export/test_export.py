"""`shoal export RUN`: a run's model out of its checkpoint, loaded back without shoal.

The model an export writes gives the logits of the model shoal itself loads from the run
(the factory's model with the checkpoint's state, as `shoal generate` reads one: the
checkpoint verified, a sharded one read whole from its DCP pieces), to 1e-5: a Hugging
Face model through `from_pretrained` (nothing missing or unexpected), any other through
`safetensors.torch.load_file`. Bad input is one line and exit code 2.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import shoal
from shoal.checkpoint.integrity import load_checkpoint
from shoal.checkpoint.manager import list_checkpoints
from shoal.checkpoint.sharded import plain_model_state
from shoal.cli.main import main
from shoal.tasks.module.config import ModuleTaskConfig
from shoal.tasks.module.factory import built, held
from tests.conftest import final_state
from tests.tasks.module.test_module import module_job

FACTORIES = Path(__file__).resolve().parent
TOKENS = torch.arange(64).remainder(256).view(2, 32)


def job(runs: Path, name: str, factory: str, strategy: dict[str, Any], **task: Any) -> Any:
    """A module job of the export tests' factories: 3 steps, evaluated at the end (best/)."""
    config = module_job(runs, name, factory, strategy, **task)
    config["task"]["import_dir"] = str(FACTORIES)
    return config


def best(run: Path) -> Path:
    found = list_checkpoints(run / "best")
    assert found, f"{run} has no best checkpoint"
    return found[-1]


def shoal_model(checkpoint: Path) -> nn.Module:
    """The model shoal loads from a checkpoint: the run's factory's model, as shoal holds it,
    with the checkpoint's state (read whole from DCP for a sharded run)."""
    state, meta = load_checkpoint(checkpoint)
    config = tomllib.loads(meta["config"])
    section = ModuleTaskConfig.model_validate(config["task"])
    made = built(section, config["train"]["seed"]).model
    model = held(made() if callable(made) and not isinstance(made, nn.Module) else made)
    model.load_state_dict(plain_model_state(checkpoint, state["model"]))
    return model.eval()


@torch.no_grad()
def logits(model: nn.Module) -> torch.Tensor:
    out = model.eval()(TOKENS)
    return out.logits if hasattr(out, "logits") else out


def export(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], str]:
    code = main(["export", *args])
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines(), captured.out


def test_a_pretrained_llama_fine_tuned_under_tensor_parallel_loads_with_from_pretrained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's test: a random tiny Llama saved with `save_pretrained`, fine-tuned from
    there under tensor_parallel 2, exported: `from_pretrained` of the export gives the
    trained model's logits, not the starting ones."""
    from transformers import LlamaForCausalLM

    from tests.export.factories import tiny_llama_config

    torch.manual_seed(0)
    base = tmp_path / "base"
    LlamaForCausalLM(tiny_llama_config()).save_pretrained(base)
    strategy = {"type": "tensor_parallel", "degree": 2}
    options = {"folder": str(base)}
    results = shoal.train(
        job(tmp_path / "runs", "tp", "factories:pretrained_llama", strategy, options=options)
    )
    run = Path(results["run_dir"])
    code, err, out = export(str(run), capsys=capsys)
    assert code == 0, err
    folder = run / "export" / best(run).name
    assert f"as hf: {folder}" in out
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "shoal-export.json",
    ]
    exported, info = LlamaForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}, info  # nothing missing or unexpected
    trained = logits(shoal_model(best(run)))
    assert torch.allclose(logits(exported), trained, atol=1e-5, rtol=0)
    starting = logits(LlamaForCausalLM.from_pretrained(base))
    assert not torch.allclose(starting, trained, atol=1e-3), "the export is the trained model"
    provenance = json.loads((folder / "shoal-export.json").read_text())
    assert provenance["shoal.step"] == str(
        json.loads((best(run) / "meta.json").read_text())["step"]
    )
    assert provenance["shoal.strategy"] == "tensor_parallel"


def test_a_gpt2_is_exported_fused_back_with_its_tied_head_written_once(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """shoal holds GPT-2's attention unfused (and its Conv1D layers as nn.Linear): the export
    is in Hugging Face's own layout, its head (tied to the token embedding) written once."""
    from safetensors import safe_open
    from transformers import GPT2LMHeadModel

    run = Path(shoal.train(job(runs, "gpt2", "factories:tied_gpt2", {"type": "local"}))["run_dir"])
    code, err, _ = export(str(run), "--out", str(runs / "gpt2-hf"), capsys=capsys)
    assert code == 0, err
    with safe_open(str(runs / "gpt2-hf" / "model.safetensors"), "pt") as written:
        names = set(written.keys())
        fused = written.get_tensor("transformer.h.0.attn.c_attn.weight")
    assert "lm_head.weight" not in names and "transformer.wte.weight" in names
    assert fused.shape == (64, 3 * 64), "Conv1D's layout: (in, 3 x out)"
    assert not any(".c_attn.q." in name for name in names)
    exported, info = GPT2LMHeadModel.from_pretrained(runs / "gpt2-hf", output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}, info
    assert exported.lm_head.weight is exported.transformer.wte.weight
    assert torch.allclose(logits(exported), logits(shoal_model(best(run))), atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A plain module of the user's own, with a tied weight, trained data-parallel."""
    runs = tmp_path_factory.mktemp("plain")
    strategy = {"type": "data_parallel", "num_replicas": 2}
    config = job(runs, "tied", "factories:tied_tower", strategy)
    config["checkpoint"] = {"every_steps": 2, "at_end": True}
    return shoal.train(config)


def test_a_plain_module_exports_to_one_safetensors_file_of_its_state(
    plain_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file, load_model

    from tests.export.factories import TiedTower

    run = Path(plain_run["run_dir"])
    out = tmp_path / "tower.safetensors"
    code, err, _ = export(str(run), "--checkpoint", "latest", "--out", str(out), capsys=capsys)
    assert code == 0, err
    state = final_state(plain_run)["model"]
    loaded = load_file(out)
    assert loaded.keys() == state.keys() - {"decode.weight"}, "a tied weight is written once"
    for name, tensor in loaded.items():
        assert torch.equal(tensor, state[name]), name
    with safe_open(str(out), "pt") as written:
        metadata = written.metadata()
    step = json.loads((Path(plain_run["checkpoint"]) / "meta.json").read_text())["step"]
    assert metadata["shoal.step"] == str(step)
    assert metadata["shoal.run"] == str(run.resolve())
    assert metadata["shoal.version"] == shoal.__version__
    assert json.loads(metadata["shoal.tied"]) == {"decode.weight": "encode.weight"}
    model = TiedTower()
    load_model(model, out)  # safetensors' own loader ties the alias back
    assert model.decode.weight is model.encode.weight
    assert torch.equal(model.decode.weight, state["decode.weight"])


def test_a_named_step_is_exported(
    plain_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import load_file

    run = Path(plain_run["run_dir"])
    code, err, _ = export(str(run), "--checkpoint", "step-2", capsys=capsys)
    assert code == 0, err
    step2 = run / "checkpoints" / "step-00000002"
    written = load_file(run / "export" / "step-00000002.safetensors")
    saved = torch.load(step2 / "state.pt", weights_only=True)["model"]
    assert all(torch.equal(written[name], saved[name]) for name in written)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: a disk that an export fills (root only)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


BAD = [
    ("no run", ["{tmp}/nowhere"], r"{tmp}/nowhere: no such run directory"),
    (
        "no such step",
        ["{run}", "--checkpoint", "step-7"],
        r"--checkpoint step-7: no such checkpoint in {run} \(the run has: checkpoints/",
    ),
    (
        "hf of a plain module",
        ["{run}", "--format", "hf"],
        r"--format hf: the run's model is a TiedTower, not a Hugging Face PreTrainedModel; "
        r"export it with --format safetensors",
    ),
    (
        "an unknown format",
        ["{run}", "--format", "onnx"],
        r"--format onnx: choose safetensors or hf",
    ),
    (
        "an existing --out",
        ["{run}", "--out", "{tmp}"],
        r"--out {tmp}: exists already; give a new path",
    ),
]


@pytest.mark.parametrize(("args", "expected"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_export_input_is_one_line(
    plain_run: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    expected: str,
) -> None:
    run = plain_run["run_dir"]
    filled = [a.format(tmp=tmp_path, run=run) for a in args]
    code, err, _ = export(*filled, capsys=capsys)
    assert code == 2
    assert len(err) == 1, err
    assert re.match(expected.format(tmp=re.escape(str(tmp_path)), run=re.escape(run)), err[0]), err


def test_a_run_without_a_best_checkpoint_names_the_others(
    plain_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = Path(plain_run["run_dir"])
    moved = tmp_path / "run"
    subprocess.run(["cp", "-r", str(run), str(moved)], check=True)
    subprocess.run(["rm", "-r", str(moved / "best")], check=True)
    code, err, _ = export(str(moved), capsys=capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"{moved}: no best checkpoint ({moved}/best/step-*/;"), err
    assert "--checkpoint (latest, step-N, or a checkpoint folder)" in err[0]
    assert "(the run has: checkpoints/step-00000002" in err[0]


def test_a_corrupt_checkpoint_is_refused_in_one_line(
    plain_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same verification as a resume: a byte changed in state.pt is refused."""
    copy = tmp_path / "checkpoint"
    subprocess.run(["cp", "-r", plain_run["checkpoint"], str(copy)], check=True)
    data = bytearray((copy / "state.pt").read_bytes())
    data[-100] ^= 0xFF
    (copy / "state.pt").write_bytes(bytes(data))
    out = tmp_path / "out.safetensors"
    code, err, _ = export(
        plain_run["run_dir"], "--checkpoint", str(copy), "--out", str(out), capsys=capsys
    )
    assert code == 2 and len(err) == 1, err
    assert err[0] == (
        f"{copy}: checkpoint is corrupt (state.pt does not match its checksum); name one "
        "with --checkpoint (latest, step-N, or a checkpoint folder)"
    )
    assert not out.exists()


def test_a_full_disk_is_one_line_and_leaves_nothing(
    plain_run: dict[str, Any], small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A disk filled to its last byte: one line naming it; no file, no temporary left."""
    filler = small_disk / "filler"
    with open(filler, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass  # full
    out = small_disk / "model.safetensors"
    code, err, _ = export(plain_run["run_dir"], "--out", str(out), capsys=capsys)
    assert code == 2 and len(err) == 1, err
    assert re.fullmatch(
        rf"export of .* not written: the disk holding {re.escape(str(small_disk))} is full "
        r"\(.* bytes free\); free some space or give --out on another disk",
        err[0],
    ), err
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


LAYOUTS = [
    {"type": "fully_sharded", "degree": 2},
    {"type": "pipeline", "stages": 2, "schedule": "gpipe", "microbatches": 2},
    {"type": "hybrid", "mesh": {"data": 2, "tensor": 2}},
]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", LAYOUTS, ids=[s["type"] for s in LAYOUTS])
def test_every_model_parallel_layout_exports_a_model_from_pretrained_loads(
    runs: Path, capsys: pytest.CaptureFixture[str], strategy: dict[str, Any]
) -> None:
    """A Llama trained under FSDP, a pipeline of stages, and a data x tensor mesh: each
    export loads with `from_pretrained` and gives the logits shoal loads from the run."""
    from transformers import LlamaForCausalLM

    config = module_job(runs, strategy["type"], "hf_models:llama", strategy)
    run = Path(shoal.train(config)["run_dir"])
    code, err, _ = export(str(run), capsys=capsys)
    assert code == 0, err
    exported, info = LlamaForCausalLM.from_pretrained(
        run / "export" / best(run).name, output_loading_info=True
    )
    assert {k: v for k, v in info.items() if v} == {}, info
    assert torch.allclose(logits(exported), logits(shoal_model(best(run))), atol=1e-5, rtol=0)


def test_shoals_own_language_model_exports_with_its_tied_head_written_once(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task of shoal's own (no factory): its checkpoint's names, the head that shares the
    token embedding's memory in state.pt written once; safetensors' `load_model` gives the
    model `shoal generate` loads."""
    from safetensors.torch import load_file, load_model

    from shoal.tasks.lm.generate import load_best_model
    from shoal.tasks.lm.model import build_lm
    from tests.tasks.lm.helpers import lm_job, write_text

    model = {"dim": 32, "heads": 4, "layers": 2, "context": 16, "tie_embeddings": True}
    config = lm_job(runs, write_text(tmp_path), task={"model": model})
    run = Path(shoal.train(config)["run_dir"])
    code, err, _ = export(str(run), "--out", str(tmp_path / "lm.safetensors"), capsys=capsys)
    assert code == 0, err
    trained, tokenizer, _ = load_best_model(run)
    assert "head.weight" not in load_file(tmp_path / "lm.safetensors")
    fresh = build_lm(trained.config, tokenizer.vocab_size)
    load_model(fresh, tmp_path / "lm.safetensors")
    assert fresh.head.weight is fresh.embed.tok.weight
    theirs = trained.state_dict()
    assert all(torch.equal(t, theirs[name]) for name, t in fresh.state_dict().items())
