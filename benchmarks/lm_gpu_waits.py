"""Where shoal's local lm step waits for the GPU, beside the plain loop (needs CUDA).

Profiles --steps steps of shoal's `local` lm and of the plain loop of
`lm_parallel.py` (AdamW, clipping, random windows) with torch.profiler, and prints per
step: the CUDA runtime calls that make the host wait or copy (cudaStreamSynchronize,
cudaMemcpyAsync) and the kernel launches; then the ops whose GPU time differs most. A
record_function's GPU time is its span on the GPU's timeline: where the host launched
its kernels onto an idle GPU (after a wait), the span holds the host's launch time too
(AdamW's 2.5 ms against 0.65 ms on an H100, the same kernels). shoal's run includes its
start and its evaluation, so its counts are slightly high.

    python benchmarks/lm_gpu_waits.py [--steps 60] [--dim 384] [--layers 6] [--context 256]
        [--batch 64]
"""

from __future__ import annotations

import argparse
import collections
import tempfile
from typing import Any

import torch
import torch.nn.functional as F
from lm_parallel import lm_config  # beside this file
from torch.profiler import ProfilerActivity, profile

import shoal
from shoal.tasks.lm.config import LMModelConfig
from shoal.tasks.lm.model import build_lm

RUNTIME = ("cudaStreamSynchronize", "cudaMemcpyAsync", "cudaLaunchKernel", "cudaLaunchKernelExC")
VOCAB = 65
ACTIVITIES = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])


def runtime_calls(prof: Any) -> collections.Counter[str]:
    return collections.Counter(e.name for e in prof.events() if e.name in RUNTIME)


def gpu_ms(prof: Any) -> dict[str, tuple[int, float]]:
    return {
        e.key: (e.count, e.device_time_total / 1e3)
        for e in prof.key_averages()
        if e.device_time_total > 0
    }


def shoal_profile(args: argparse.Namespace) -> Any:
    with tempfile.TemporaryDirectory() as runs:
        shoal.train(lm_config(args, {"type": "local"}, "warm", runs))  # CUDA's first use
        with profile(activities=ACTIVITIES) as prof:
            shoal.train(lm_config(args, {"type": "local"}, "profiled", runs))
    return prof


def plain_profile(args: argparse.Namespace) -> Any:
    config = LMModelConfig(dim=args.dim, heads=4, layers=args.layers, context=args.context)
    torch.manual_seed(1)
    model = build_lm(config, VOCAB).to(args.device)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    generator = torch.Generator().manual_seed(2)

    def steps(count: int) -> None:
        for _ in range(count):
            shape = (args.batch, args.context + 1)
            tokens = torch.randint(0, VOCAB, shape, generator=generator).to(args.device)
            for p in params:
                p.grad = None
            logits = model(tokens[:, :-1]).reshape(-1, VOCAB).float()
            loss = F.cross_entropy(logits, tokens[:, 1:].reshape(-1), reduction="sum")
            (loss / (args.context * args.batch)).backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
        if args.device == "cuda":
            torch.cuda.synchronize()

    steps(5)
    with profile(activities=ACTIVITIES) as prof:
        steps(args.steps)
    return prof


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a dry run")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("needs a CUDA device (--device cpu: a dry run, no CUDA figures)")
    mine, plain = shoal_profile(args), plain_profile(args)
    calls, plain_calls = runtime_calls(mine), runtime_calls(plain)
    print("CUDA runtime calls per step, shoal / plain:")
    for name in RUNTIME:
        print(f"  {name}: {calls[name] / args.steps:.1f} / {plain_calls[name] / args.steps:.1f}")
    a, b = gpu_ms(mine), gpu_ms(plain)
    print("GPU ms per step (calls per step), shoal / plain, the largest differences:")
    for key in sorted(
        set(a) | set(b), key=lambda k: -abs(a.get(k, (0, 0))[1] - b.get(k, (0, 0))[1])
    )[:12]:
        x, y = a.get(key, (0, 0.0)), b.get(key, (0, 0.0))
        print(
            f"  {key[:60]}: {x[1] / args.steps:.3f} ({x[0] / args.steps:.1f}) / "
            f"{y[1] / args.steps:.3f} ({y[0] / args.steps:.1f})"
        )


if __name__ == "__main__":
    main()
