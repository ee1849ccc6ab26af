"""Your model, every strategy: a Hugging Face Llama under shoal beside plain torch scripts.

The model is a `LlamaForCausalLM` built from its config (nothing downloaded; by default 4
layers, width 128, 4 heads, 2 key/value heads, context 128, vocabulary 256: the bytes of
tinyshakespeare). shoal trains it as a user does, `[task] type = "module"` with the
factory `examples/your_models.py:causal_lm`; the plain scripts build the same config by
hand (checked equal to the factory's before anything runs) and lay the model out with
torch's own APIs, 2 processes over gloo:

- **fully_sharded 2** beside FSDP2: `fully_shard` on each `LlamaDecoderLayer`, then the
  root, on a 1-D DeviceMesh of the 2 ranks; each rank half of the batch.
- **tensor_parallel 2** beside `parallelize_module` with the Llama plan: q/k/v/gate/up
  column-wise, o/down row-wise, the embedding row-wise with a replicated output, the head
  column-wise with a replicated output (the plan shoal detects from the model's
  `base_model_tp_plan`, `src/shoal/tasks/module/layout.py` family_patterns).
- **pipeline 2** beside `torch.distributed.pipelining`: PipelineStages on stages cut by
  hand (embeddings + the first half of the layers; the second half + the final norm +
  the head), the same schedule (--schedule, 1f1b by default) and micro-batches (4);
  shoal is given the same cut (`split_points`).

Both sides: the same global batch and context, AdamW (lr 1e-3), clipping to a global norm
of 1.0, windows of the same bytes drawn at random. tokens/s is the timed steps' tokens
over their step time (the first --warmup steps are not timed; the plain script's slowest
rank), the batch's fetch inside the step on both sides. Each row runs --rounds times,
shoal and the plain script alternately (the one that goes first swaps every round); the
ratio shoal / plain is taken per round and summarised by its geometric mean, the
standard error of the mean log ratio (as a factor), its median (a round another process
disturbed moves it least) and the rounds shoal lost. --phases
prints each rank's time per step phase, shoal's from its records beside the plain
script's.

`--contender accelerate --accelerate-python VENV/bin/python` runs the fully_sharded row
beside Hugging Face Accelerate instead (accelerate_child.py, launched by `accelerate
launch` with accelerate_fsdp2_cpu.yaml in that venv: Accelerate stays out of shoal's
environment). Accelerate 1.15 does not shard on CPU: its FSDP config becomes DDP there
(each round prints what Accelerate built; docs/benchmarks/model-parallel.md says why).

    .venv/bin/python benchmarks/hf_parallel.py [--rounds 3] [--steps 40] [--warmup 10]
        [--only fully_sharded|tensor_parallel|pipeline] [--width 128] [--layers 4]
        [--context 128] [--batch 16] [--schedule 1f1b|gpipe] [--microbatches 4] [--phases]
        [--contender plain|accelerate] [--accelerate-python PATH]
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from lm_parallel import clip, print_phases
from torch import nn

import shoal

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
EXAMPLES = REPO / "examples"
TEXT = REPO.parent / "shared" / "datasets" / "tinyshakespeare" / "input.txt.gz"
INTERVAL = 5  # shoal logs a record every INTERVAL steps; warmup and steps are multiples
VALID_FRACTION = 0.002  # the factory's held-out tail: a few windows, evaluated once at the end
ROWS = ("fully_sharded", "tensor_parallel", "pipeline")
# beside Accelerate: its FSDP config on CPU builds DDP, so shoal's data_parallel runs too
ACCELERATE_ROWS = ("fully_sharded", "data_parallel")


# ---------------------------------------------------------------- the model and the data


def factory_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of examples/your_models.py:causal_lm for this benchmark."""
    return {
        "text": str(TEXT),
        "layers": args.layers,
        "width": args.width,
        "heads": 4,
        "kv_heads": 2,
        "context": args.context,
        "valid_fraction": VALID_FRACTION,
    }


def llama_options(args: argparse.Namespace) -> dict[str, Any]:
    """The plain scripts' LlamaConfig keyword arguments, as a user of transformers writes
    them (also handed to the Accelerate script, which builds its own config)."""
    return {
        "vocab_size": 256,
        "hidden_size": args.width,
        "intermediate_size": 4 * args.width,
        "num_hidden_layers": args.layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": args.context,
        "tie_word_embeddings": False,
    }


def llama_config(args: argparse.Namespace) -> Any:
    """The plain scripts' model config."""
    from transformers import LlamaConfig

    return LlamaConfig(**llama_options(args))


def check_same_model(args: argparse.Namespace) -> None:
    """The factory's model config equals the plain scripts' (else the rows compare two
    models): stop with one line naming the keys that differ."""
    sys.path.insert(0, str(EXAMPLES))
    from your_models import causal_lm

    theirs = causal_lm(**factory_options(args))["model"]().config.to_dict()
    mine = llama_config(args).to_dict()
    differ = sorted(k for k in theirs.keys() | mine.keys() if theirs.get(k) != mine.get(k))
    if differ:
        raise SystemExit(f"hf_parallel: the factory's Llama config differs in {differ}")


def train_windows(context: int) -> torch.Tensor:
    """The training bytes as rows of `context` tokens (the factory's ByteWindows, stacked)."""
    with gzip.open(TEXT, "rb") as handle:
        tokens = torch.frombuffer(bytearray(handle.read()), dtype=torch.uint8).long()
    train = tokens[: int(len(tokens) * (1 - VALID_FRACTION))]
    count = (len(train) - 1) // context
    return train[: count * context].view(count, context)


# ---------------------------------------------------------------- shoal


def shoal_config(args: argparse.Namespace, row: str, scratch: str) -> dict[str, Any]:
    """The user's job: the factory's Llama under the row's [strategy]."""
    strategy: dict[str, Any]
    if row == "pipeline":
        strategy = {
            "type": "pipeline",
            "stages": 2,
            "schedule": args.schedule,
            "microbatches": args.microbatches,
            "split_points": [f"model.layers.{args.layers // 2}"],  # the plain script's cut
        }
    elif row == "data_parallel":
        strategy = {"type": row, "num_replicas": 2}  # the global batch split over the two
    else:
        strategy = {"type": row, "degree": 2}
    return {
        "task": {
            "type": "module",
            "factory": "your_models:causal_lm",
            "import_dir": str(EXAMPLES),
            "options": factory_options(args),
        },
        "strategy": strategy,
        "train": {
            "max_steps": args.steps,
            "batch_size": args.batch,
            "drop_last": True,
            "seed": 1,
            "optimizer": {"kind": "adamw", "lr": 1e-3},
            "grad_clip_norm": 1.0,
        },
        "checkpoint": {"every_epochs": 0, "at_end": False, "keep_best": False},
        "monitor": {"progress": "off", "log_every_steps": INTERVAL},
        "run": {"dir": scratch, "name": row},
    }


def shoal_row(args: argparse.Namespace, row: str, scratch: str) -> dict[str, Any]:
    """shoal's tokens/s over its timed steps (the records after the warmup)."""
    result = shoal.train(shoal_config(args, row, scratch))
    lines = (Path(result["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if r["event"] == "train"]
    timed = records[args.warmup // INTERVAL :]
    if args.phases:
        print_phases(result["world_size"], timed)
    steps = len(timed) * INTERVAL
    return {"tokens_s": steps * args.batch * args.context / sum(r["step_s"] for r in timed)}


# ---------------------------------------------------------------- the plain scripts


def tensor_plan(model: nn.Module) -> dict[str, Any]:
    """The Llama plan, torchtitan-style: each layer's projections, the embedding, the head."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Replicate()),
    }
    for index in range(len(model.model.layers)):  # type: ignore[union-attr, arg-type]
        at = f"model.layers.{index}"
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            plan[f"{at}.{name}"] = ColwiseParallel()
        plan[f"{at}.self_attn.o_proj"] = RowwiseParallel()
        plan[f"{at}.mlp.gate_proj"] = ColwiseParallel()
        plan[f"{at}.mlp.up_proj"] = ColwiseParallel()
        plan[f"{at}.mlp.down_proj"] = RowwiseParallel()
    return plan


class Stage(nn.Module):
    """Layers first..last of a Llama, with the embedding on the first stage and the final
    norm and head on the last: the model's own forward (LlamaModel.forward), cut."""

    def __init__(self, model: Any, first: int, last: int) -> None:
        super().__init__()
        base = model.model
        self.config = model.config
        self.layers = nn.ModuleList(base.layers[first : last + 1])
        self.rotary_emb = base.rotary_emb
        self.embed_tokens = base.embed_tokens if first == 0 else None
        at_end = last == len(base.layers) - 1
        self.norm = base.norm if at_end else None
        self.lm_head = model.lm_head if at_end else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask

        h = self.embed_tokens(x) if self.embed_tokens is not None else x
        positions = torch.arange(h.shape[1]).unsqueeze(0)
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=h,
            attention_mask=None,
            cache=None,
            position_ids=positions,
        )
        rotary = self.rotary_emb(h, position_ids=positions)
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
        if self.norm is not None and self.lm_head is not None:
            h = self.lm_head(self.norm(h))
        return h


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of each position's next token (targets: the ids shifted)."""
    flat = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
    return F.cross_entropy(flat, ids[:, 1:].reshape(-1))


def plain_worker(rank: int, args: argparse.Namespace, row: str, store: str) -> None:
    """One rank of the plain script of `row`; rank 0 writes the figures to store.json."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.distributed.tensor.parallel import parallelize_module
    from transformers import LlamaForCausalLM

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store, 2),
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=300),
    )
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=(row,))
    torch.manual_seed(1)
    model: Any = LlamaForCausalLM(llama_config(args))
    share = args.batch
    pipe: Any = None
    if row == "fully_sharded":
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        share = args.batch // 2
    elif row == "tensor_parallel":
        parallelize_module(model, mesh, tensor_plan(model))
    else:
        half = args.layers // 2
        first, last = (0, half - 1) if rank == 0 else (half, args.layers - 1)
        model = Stage(model, first, last)
        stage = PipelineStage(model, rank, 2, torch.device("cpu"))
        kind = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
        pipe = kind(stage, args.microbatches, loss_fn=next_token_loss)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    windows = train_windows(args.context)
    generator = torch.Generator().manual_seed(2 + rank)
    times: list[float] = []
    phases: list[tuple[float, float, float]] = []
    for step in range(args.steps):
        started = time.perf_counter()
        ids = windows[torch.randint(0, len(windows), (share,), generator=generator)]
        optimizer.zero_grad()
        if pipe is None:
            model(input_ids=ids, labels=ids).loss.backward()
        elif rank == 0:
            pipe.step(ids)
        else:
            pipe.step(target=ids)
        clipping = time.perf_counter()
        clip(params, 1.0, dist.group.WORLD if pipe is not None else None)
        stepping = time.perf_counter()
        optimizer.step()
        if step >= args.warmup:
            ended = time.perf_counter()
            times.append(ended - started)
            phases.append((clipping - started, stepping - clipping, ended - stepping))
    if args.phases:
        fb, clip_ms, opt_ms = (1e3 * sum(p) / len(p) for p in zip(*phases, strict=True))
        print(
            f"plain rank {rank} per step: batch + forward and backward {fb:.1f} ms, "
            f"clipping {clip_ms:.1f} ms, optimizer {opt_ms:.1f} ms",
            flush=True,
        )
    took = torch.tensor([sum(times)], dtype=torch.float64)
    gathered = [torch.zeros_like(took) for _ in range(2)]
    dist.all_gather(gathered, took)
    if rank == 0:
        slowest = max(float(g) for g in gathered)
        tokens_s = len(times) * args.batch * args.context / slowest
        Path(store + ".json").write_text(json.dumps({"tokens_s": tokens_s}))
    dist.barrier()
    dist.destroy_process_group()


def plain_row(args: argparse.Namespace, row: str, scratch: str) -> dict[str, Any]:
    # a fresh folder each run: a FileStore keeps the keys of the run before
    store = os.path.join(tempfile.mkdtemp(dir=scratch), f"store-{row}")
    mp.start_processes(plain_worker, args=(args, row, store), nprocs=2, start_method="spawn")
    return json.loads(Path(store + ".json").read_text())


# ---------------------------------------------------------------- Hugging Face Accelerate


def free_port() -> int:
    """A port the OS has just handed out (for the launcher's rendezvous)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def accelerate_row(args: argparse.Namespace, row: str, scratch: str) -> dict[str, Any]:
    """Accelerate's run of the same job (accelerate_child.py in args.accelerate_python's
    venv, `accelerate launch` with accelerate_fsdp2_cpu.yaml, 2 processes); its report.

    ACCELERATE_USE_CPU=true: with an FSDP config Accelerate's launcher takes its
    multi-GPU path, which does not pass the config's `use_cpu` on, so without a GPU each
    process would come up as a single, unsynchronised run (DistributedType.NO); set, the
    processes form one gloo group. The report says what Accelerate made of the config
    (its distributed type and the model's wrapper): on CPU it is not FSDP (see
    docs/benchmarks/model-parallel.md)."""
    work = Path(tempfile.mkdtemp(dir=scratch))
    windows = Path(scratch) / "windows.pt"
    if not windows.exists():
        torch.save(train_windows(args.context), windows)
    settings = {
        "config": llama_options(args),
        "windows": str(windows),
        "batch": args.batch,
        "context": args.context,
        "steps": args.steps,
        "warmup": args.warmup,
    }
    (work / "settings.json").write_text(json.dumps(settings))
    command = [
        str(args.accelerate_python),
        *("-m", "accelerate.commands.launch", "--config_file"),
        str(HERE / "accelerate_fsdp2_cpu.yaml"),
        *("--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port())),
        str(HERE / "accelerate_child.py"),
        *(str(work / "settings.json"), str(work / "report.json")),
    ]
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "PYTHONPATH": ""}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode or not (work / "report.json").exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        raise SystemExit(f"hf_parallel: the Accelerate run failed ({done.returncode}): {tail}")
    return json.loads((work / "report.json").read_text())


# ---------------------------------------------------------------- rounds and the summary


def per_round(ratios: list[float]) -> tuple[float, float, int]:
    """The rounds' ratios as (geometric mean, standard error of the mean log ratio as a
    factor, rounds below 1). A round's two runs follow each other, so the machine's drift
    cancels in its ratio more than in two medians over all rounds."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    spread = statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else 0.0
    return math.exp(mean), math.exp(spread), sum(x < 0 for x in logs)


ACCELERATE_VENV = Path(__file__).resolve().parents[1] / ".venv-accelerate"


def accelerate_requirements() -> list[str]:
    """Accelerate beside this torch and this environment's transformers, pinned."""
    from importlib.metadata import version

    return [
        "torch==2.13.0",
        "accelerate==1.15.0",
        f"transformers=={version('transformers')}",
    ]


def ensure_accelerate_venv(path: Path = ACCELERATE_VENV) -> Path:
    """Create Accelerate's venv once, apart from shoal's (a stamp file records what was
    installed; torch pinned so that pip never resolves another); its python."""
    python = path / "bin" / "python"
    stamp = path / ".accelerate-installed"
    wanted = accelerate_requirements()
    if stamp.exists() and stamp.read_text().split() == wanted:
        return python
    if not python.exists():
        venv.create(path, with_pip=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, wanted[0]], check=True)  # torch first, then nothing moves it
    subprocess.run([*pip, *wanted], check=True)
    stamp.write_text(" ".join(wanted) + "\n")
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", choices=ROWS + ACCELERATE_ROWS[1:], help="one row (data_parallel: Accelerate)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--phases", action="store_true", help="each rank's time per phase")
    parser.add_argument(
        "--contender",
        choices=("plain", "accelerate"),
        default="plain",
        help="what shoal runs beside: the plain torch scripts, or Hugging Face Accelerate "
        "(the fully_sharded and data_parallel rows)",
    )
    parser.add_argument(
        "--accelerate-python",
        type=Path,
        help="the python of a venv with accelerate and transformers (torch==2.13.0); "
        f"without it, the benchmark makes one in {ACCELERATE_VENV.name} at the repository's root",
    )
    args = parser.parse_args()
    if args.contender == "accelerate":
        if args.accelerate_python is None:
            args.accelerate_python = ensure_accelerate_venv()
        elif not args.accelerate_python.exists():
            parser.error("--contender accelerate: --accelerate-python PATH (an existing python)")
        if args.only not in (None, *ACCELERATE_ROWS):
            parser.error(f"--contender accelerate: the rows {', '.join(ACCELERATE_ROWS)}")
    elif args.only == "data_parallel":
        parser.error("--only data_parallel: with --contender accelerate")
    if args.warmup % INTERVAL or args.steps % INTERVAL or args.steps <= args.warmup:
        parser.error(f"--steps and --warmup: multiples of {INTERVAL}, steps > warmup")
    check_same_model(args)
    rows = (
        [args.only] if args.only else list(ACCELERATE_ROWS if args.contender != "plain" else ROWS)
    )
    contender = accelerate_row if args.contender == "accelerate" else plain_row
    table = []
    with tempfile.TemporaryDirectory() as scratch:
        for row in rows:
            pairs = []
            for index in range(args.rounds):
                if index % 2:  # the side that goes first swaps every round
                    plain = contender(args, row, scratch)
                    mine = shoal_row(args, row, scratch)
                else:
                    mine = shoal_row(args, row, scratch)
                    plain = contender(args, row, scratch)
                pairs.append((mine["tokens_s"], plain["tokens_s"]))
                got = {k: v for k, v in plain.items() if k != "tokens_s"}
                print(
                    f"{row} round {index + 1}: shoal {mine['tokens_s']:.0f} tokens/s, "
                    f"{args.contender} {plain['tokens_s']:.0f}, ratio "
                    f"{mine['tokens_s'] / plain['tokens_s']:.3f}" + (f" {got}" if got else ""),
                    flush=True,
                )
            table.append((row, pairs))
    name = {"pipeline": f"pipeline 2 ({args.schedule}, {args.microbatches} micro-batches)"}
    print(
        f"\n| strategy | shoal tokens/s (median) | {args.contender} tokens/s (median) | "
        f"shoal / {args.contender} per round: geometric mean | standard error | median | "
        "rounds lost |"
    )
    print("|---|---|---|---|---|---|---|")
    for row, pairs in table:
        ratios = [a / b for a, b in pairs]
        mean, error, lost = per_round(ratios)
        print(
            f"| {name.get(row, row + ' 2')} | {statistics.median(a for a, _ in pairs):.0f} | "
            f"{statistics.median(b for _, b in pairs):.0f} | {mean:.3f} | x{error:.3f} | "
            f"{statistics.median(ratios):.3f} | {lost} of {len(pairs)} |"
        )
        each = ", ".join(f"{a:.0f} / {b:.0f}" for a, b in pairs)
        print(f"  {row} by round, shoal / {args.contender} tokens/s: {each}")


if __name__ == "__main__":
    main()
