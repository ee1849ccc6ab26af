"""The lm under model parallelism: shoal's pipeline beside the same schedule in a plain script.

For each schedule (gpipe, 1f1b, interleaved_1f1b) and micro-batch count (4, 8) on 2
ranks: shoal trains the tinyshakespeare lm for --steps steps (`[strategy] type =
"pipeline"`, the balanced partition), and a plain script builds the same model, the
same stages (blocks split in equal halves, or quarters for the interleaved schedule)
and torch's schedule directly (torch.distributed.pipelining, gloo), with AdamW and
clipping, on random windows of the same shape. Tokens/s are the timed steps' tokens
over their step time (the first --warmup steps are not timed); per-rank peak memory is
the process's peak resident set (shoal's results.json `pipeline.ranks[*].peak_mb`; the
plain script's getrusage); the bubble is shoal's measured fraction beside the theory.

    .venv/bin/python benchmarks/lm_parallel.py [--steps 30] [--dim 128] [--layers 4]
        [--context 64] [--batch 16]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import shoal

REPO = Path(__file__).resolve().parents[1]
TEXT = REPO.parent / "shared" / "datasets" / "tinyshakespeare" / "input.txt.gz"
INTERVAL = 5


def shoal_row(args: argparse.Namespace, schedule: str, m: int, scratch: str) -> dict[str, Any]:
    strategy: dict[str, Any] = {"type": "pipeline", "stages": 2, "microbatches": m}
    strategy["schedule"] = schedule
    config = {
        "task": {
            "type": "lm",
            "data": {"train": str(TEXT)},
            "model": {"dim": args.dim, "heads": 4, "layers": args.layers, "context": args.context},
            "evaluation": {"max_windows": 1},
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
        "run": {"dir": scratch, "name": f"{schedule}-{m}"},
    }
    result = shoal.train(config)
    lines = (Path(result["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    train = [r for r in map(json.loads, lines) if r["event"] == "train"][args.warmup // INTERVAL :]
    tokens = sum(r["samples"] for r in train) * args.context
    section = result["pipeline"]
    return {
        "tokens_s": tokens / sum(r["step_s"] for r in train),
        "peak_mb": [r["peak_mb"] for r in section["ranks"]],
        "bubble": section["bubble"]["measured"],
        "theory": section["bubble"]["theory"],
    }


def plain_worker(rank: int, args: argparse.Namespace, schedule: str, m: int, store: str) -> None:
    """The same pipeline written directly against torch.distributed.pipelining."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    from shoal.tasks.lm.config import LMModelConfig
    from shoal.tasks.lm.model import build_lm

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store, 2),
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=120),
    )
    vocab = 65
    config = LMModelConfig(dim=args.dim, heads=4, layers=args.layers, context=args.context)
    torch.manual_seed(1)
    model = build_lm(config, vocab)
    total = 4 if schedule == "interleaved_1f1b" else 2
    per = args.layers // total
    mine = [rank + 2 * k for k in range(total // 2)]
    modules = [model.stage(i * per, (i + 1) * per - 1) for i in mine]
    stages = [
        PipelineStage(mod, i, total, torch.device("cpu"))
        for mod, i in zip(modules, mine, strict=True)
    ]
    params = [p for mod in modules for p in mod.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    batch = args.batch

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        flat = logits.reshape(-1, vocab).float()
        return F.cross_entropy(flat, targets.reshape(-1), reduction="sum") / (args.context * batch)

    if schedule == "interleaved_1f1b":
        pipe: Any = ScheduleInterleaved1F1B(stages, m, loss_fn=loss_fn, scale_grads=False)
    else:
        kind = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
        pipe = kind(stages[0], m, loss_fn=loss_fn, scale_grads=False)
    generator = torch.Generator().manual_seed(2)
    times = []
    for step in range(args.steps):
        tokens = torch.randint(0, vocab, (batch, args.context + 1), generator=generator)
        started = time.perf_counter()
        for p in params:
            p.grad = None
        if rank == 0:
            pipe.step(tokens[:, :-1], return_outputs=False)
        else:
            pipe.step(target=tokens[:, 1:], return_outputs=False)
        square = torch.stack([p.grad.norm() ** 2 for p in params if p.grad is not None]).sum()
        dist.all_reduce(square)
        torch.nn.utils.clip_grads_with_norm_(params, 1.0, square.sqrt())
        optimizer.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    figures = torch.tensor([sum(times), peak_mb], dtype=torch.float64)
    gathered = [torch.zeros_like(figures) for _ in range(2)]
    dist.all_gather(gathered, figures)
    if rank == 0:
        step_s = max(float(g[0]) for g in gathered)
        out = {
            "tokens_s": len(times) * batch * args.context / step_s,
            "peak_mb": [float(g[1]) for g in gathered],
        }
        Path(store + ".json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


def plain_row(args: argparse.Namespace, schedule: str, m: int, scratch: str) -> dict[str, Any]:
    store = os.path.join(scratch, f"store-{schedule}-{m}")
    mp.start_processes(
        plain_worker, args=(args, schedule, m, store), nprocs=2, start_method="spawn"
    )
    return json.loads(Path(store + ".json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    print(
        "| schedule | micro-batches | shoal tokens/s | plain tokens/s | ratio | shoal peak MiB "
        "(rank 0, 1) | plain peak MiB (rank 0, 1) | bubble measured | bubble theory |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for schedule in ("gpipe", "1f1b", "interleaved_1f1b"):
            for m in (4, 8):
                mine = shoal_row(args, schedule, m, scratch)
                plain = plain_row(args, schedule, m, scratch)
                ratio = mine["tokens_s"] / plain["tokens_s"]
                print(
                    f"| {schedule} | {m} | {mine['tokens_s']:.0f} | {plain['tokens_s']:.0f} | "
                    f"{ratio:.2f} | {', '.join(f'{x:.0f}' for x in mine['peak_mb'])} | "
                    f"{', '.join(f'{x:.0f}' for x in plain['peak_mb'])} | "
                    f"{mine['bubble']:.2f} | {mine['theory']:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
