"""`shoal generate`: sampling from a run's best checkpoint, and its one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import shoal
from shoal.checkpoint.sharded import read_full
from shoal.cli.main import main
from shoal.tasks.lm.generate import load_best_model, sample
from tests.conftest import run_shoal, small_job
from tests.tasks.lm.helpers import VERSE, lm_job, write_text


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("generate")
    text = write_text(folder)
    results = shoal.train(
        lm_job(folder / "runs", text, train={"max_steps": 40}, run={"name": "lm"})
    )
    text.unlink()  # generation needs the run directory only
    return Path(results["run_dir"])


def test_generate_is_seeded_and_continues_the_prompt(lm_run: Path, tmp_path: Path) -> None:
    args = ["generate", str(lm_run), "--prompt", "To be", "--tokens", "40", "--top-k", "5"]
    first = run_shoal(*args, "--seed", "1", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("To be") and len(first.stdout.rstrip("\n")) == 45
    assert set(first.stdout) <= set(VERSE), "only characters of the vocabulary"
    assert run_shoal(*args, "--seed", "1", cwd=tmp_path).stdout == first.stdout
    assert run_shoal(*args, "--seed", "2", cwd=tmp_path).stdout != first.stdout


def test_greedy_sampling_follows_the_most_likely_token(lm_run: Path) -> None:
    model, tokenizer, checkpoint = load_best_model(lm_run)
    assert checkpoint.parent.name == "best"
    prompt = torch.from_numpy(tokenizer.encode("Whether 'tis")).long()
    out = sample(model, prompt, 30, temperature=1e-4, top_k=1)
    step = prompt
    for _ in range(30):
        step = torch.cat([step, model(step[-16:].unsqueeze(0))[0, -1].argmax().view(1)])
    assert torch.equal(out, step) and len(out) == len(prompt) + 30, "crops to the context"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt", "To be!"], "--prompt: character '!' (at 5) is not in the model's vocabulary"),
        (["--prompt", ""], "--prompt: empty; give at least one character"),
        (["--prompt", "To", "--temperature", "0"], "--temperature: must be > 0, got 0.0"),
        (["--prompt", "To", "--tokens", "0"], "--tokens: must be >= 1, got 0"),
        (["--prompt", "To", "--top-k", "0"], "--top-k: must be >= 1, got 0"),
    ],
)
def test_bad_arguments_are_one_line(
    lm_run: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["generate", str(lm_run), *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(message)


def test_runs_that_cannot_generate(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    no_valid = shoal.train(
        lm_job(
            runs,
            write_text(tmp_path),
            task={"data": {"train": str(tmp_path / "text.txt"), "split": 1.0}},
        )
    )
    assert main(["generate", no_valid["run_dir"], "--prompt", "To"]) == 2
    assert capsys.readouterr().err.startswith(f"{no_valid['run_dir']}: no best checkpoint")
    classifier = shoal.train(small_job(runs, train={"epochs": 1}))
    assert main(["generate", classifier["run_dir"], "--prompt", "To"]) == 2
    assert "a classification run; generate samples from language models" in capsys.readouterr().err
    assert main(["generate", str(tmp_path / "nowhere"), "--prompt", "To"]) == 2
    assert capsys.readouterr().err.strip() == f"{tmp_path / 'nowhere'}: no such run directory"


@pytest.mark.parametrize(
    "strategy",
    [{"type": "tensor_parallel", "degree": 2}, {"type": "fully_sharded", "degree": 2}],
    ids=["tensor_parallel", "fully_sharded"],
)
def test_generate_reads_a_sharded_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], strategy: dict[str, object]
) -> None:
    """A run whose checkpoints hold the model in DCP's pieces samples the same text as the
    model those pieces make up (it raised 'Unexpected key(s) in state_dict: "sharded"')."""
    job = lm_job(tmp_path / "runs", write_text(tmp_path), strategy=strategy, train={"max_steps": 8})
    run_dir = Path(shoal.train(job)["run_dir"])
    model, _, checkpoint = load_best_model(run_dir)
    assert (checkpoint / "sharded").is_dir()
    whole = read_full(checkpoint)["model"]
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, whole[name]), name
    assert main(["generate", str(run_dir), "--prompt", "To be", "--tokens", "20"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("To be") and len(text.rstrip("\n")) == 25
