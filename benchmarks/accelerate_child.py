"""Hugging Face Accelerate's side of `hf_parallel.py --contender accelerate`: one rank.

Accelerate lives in its own venv (it must not change shoal's environment), so this file
imports nothing from shoal and `hf_parallel.py` starts it with that venv's
`accelerate launch` (2 CPU processes, gloo, the FSDP config `accelerate_fsdp2_cpu.yaml`):

    ACCEL_VENV/bin/python -m accelerate.commands.launch --config_file \
        benchmarks/accelerate_fsdp2_cpu.yaml --main_process_port PORT \
        benchmarks/accelerate_child.py SETTINGS.json REPORT.json

SETTINGS.json gives the model's config (the LlamaConfig keyword arguments of
`hf_parallel.llama_config`), the training windows file (a tensor saved by the parent),
batch, steps and warmup. The loop is Accelerate's documented one (prepare the model,
then the optimizer; `accelerator.backward`, `accelerator.clip_grad_norm_`), with the
plain FSDP2 script's batch draw (random windows, each rank half of the global batch)
and timing (the timed steps' tokens over the slowest rank's step time). Rank 0 writes
REPORT.json: tokens/s, Accelerate's version and the FSDP version it used.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import accelerate
import torch
import torch.distributed as dist
from accelerate import Accelerator
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    settings = json.loads(Path(sys.argv[1]).read_text())
    report = Path(sys.argv[2])
    torch.set_num_threads(1)  # as the plain script and shoal: one thread per rank
    accelerator = Accelerator()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    model = accelerator.prepare(LlamaForCausalLM(LlamaConfig(**settings["config"])))
    optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-3))
    windows = torch.load(settings["windows"])
    share = settings["batch"] // world
    generator = torch.Generator().manual_seed(2 + rank)
    times: list[float] = []
    for step in range(settings["steps"]):
        started = time.perf_counter()
        ids = windows[torch.randint(0, len(windows), (share,), generator=generator)]
        optimizer.zero_grad()
        accelerator.backward(model(input_ids=ids, labels=ids).loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step >= settings["warmup"]:
            times.append(time.perf_counter() - started)
    took = torch.tensor([sum(times)], dtype=torch.float64)
    gathered = [torch.zeros_like(took) for _ in range(world)]
    dist.all_gather(gathered, took)
    if rank == 0:
        slowest = max(float(g) for g in gathered)
        plugin = getattr(accelerator.state, "fsdp_plugin", None)  # absent unless FSDP
        report.write_text(
            json.dumps(
                {
                    "tokens_s": len(times) * settings["batch"] * settings["context"] / slowest,
                    "accelerate": accelerate.__version__,
                    "distributed_type": str(accelerator.distributed_type),
                    "accelerate_processes": accelerator.num_processes,
                    "fsdp_version": getattr(plugin, "fsdp_version", None),
                    "model_type": type(model).__module__ + "." + type(model).__name__,
                }
            )
        )
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
