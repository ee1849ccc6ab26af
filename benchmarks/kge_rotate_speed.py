"""RotatE's training throughput against TransE's at equal dim, negatives and batch.

    one-at-a-time .venv/bin/python benchmarks/kge_rotate_speed.py train --steps 40
    one-at-a-time .venv/bin/python benchmarks/kge_rotate_speed.py micro

`train`: `shoal.train` on FB15k-237 (strategy local, no evaluation, no checkpoints) for
each model at the same settings (dim, negatives per positive shared by chunks, batch,
loss, sparse Adam), skipping the first --warmup steps' time; prints triples/s and the
ratio TransE / RotatE. `--reference` scores RotatE with the cdist path it had before
`rotate_distances` (the before figure).

`micro`: forward + backward of one chunked negative scoring, RotatE's reference
(`RotatE.match` through cdist) against `rotate_distances`' tiles for a few tile sizes
and its compiled kernels, with the largest difference of scores and gradients.

`--no-compile` (train): RotatE through the tiles, as before the compiled kernels.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import shoal
from shoal.tasks.kge import models, rotate_distance

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "fb15k-237"


def job(model: dict[str, Any], args: argparse.Namespace, runs: str) -> dict[str, Any]:
    return {
        "task": {
            "type": "kge",
            "dim": args.dim,
            "model": model,
            "data": {
                "train": str(DATA / "train.txt.gz"),
                "valid": str(DATA / "valid.txt.gz"),
                "test": str(DATA / "test.txt.gz"),
            },
            "negatives": {"num_negatives": args.negatives, "chunk_size": args.chunk},
            "loss": {"kind": "logistic", "margin": 9.0, "adversarial_temperature": 1.0},
            "sparse_gradients": True,
            "evaluation": {"max_triples": 1},
        },
        "train": {
            "epochs": 1,
            "max_steps": args.steps,
            "batch_size": args.batch,
            "optimizer": {"kind": "sparse_adam", "lr": 0.001},
            "eval_every_epochs": 0,
        },
        "checkpoint": {"every_epochs": 0, "every_steps": 0, "at_end": False},
        "run": {"dir": runs},
        "monitor": {"progress": "off", "log_every_steps": 1},
    }


def steady_rate(run_dir: Path, warmup: int) -> float:
    """Triples/s over the logged steps after `warmup` (the first steps warm caches)."""
    import json

    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line) for line in lines if '"event": "train"' in line]
    kept = [s for s in steps if s["step"] > warmup]
    return sum(s["samples"] for s in kept) / sum(s["interval_s"] for s in kept)


def train(args: argparse.Namespace) -> None:
    if args.reference:
        models.RotatE.match = reference_match  # type: ignore[method-assign]
    rotate_distance.KERNELS.enabled = not args.no_compile
    rates = {}
    with tempfile.TemporaryDirectory() as runs:
        for name, model in [
            ("transe-l1", {"type": "transe", "p": 1}),
            ("transe-l2", {"type": "transe", "p": 2}),
            ("rotate", {"type": "rotate"}),
        ]:
            results = shoal.train(job(model, args, runs) | {"run": {"dir": runs, "name": name}})
            rates[name] = steady_rate(Path(results["run_dir"]), args.warmup)
            print(f"{name}: {rates[name]:.0f} triples/s", flush=True)
    for name in ("transe-l1", "transe-l2"):
        print(f"{name} / rotate: {rates[name] / rates['rotate']:.2f}x")


def reference_match(self: models.RotatE, queries: torch.Tensor, candidates: torch.Tensor) -> Any:
    """RotatE.match before the fast path: one batched cdist per complex dimension."""
    halves = models._halves
    q = torch.stack(halves(queries), dim=-1).movedim(-2, 0)
    c = torch.stack(halves(candidates), dim=-1).movedim(-2, 0)
    return -torch.cdist(q, c, compute_mode="donot_use_mm_for_euclid_dist").sum(dim=0)


def micro(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    chunks = max(1, args.batch // args.chunk)
    q0 = torch.randn(chunks, args.chunk, args.dim)
    c0 = torch.randn(chunks, args.negatives, args.dim)
    weights = torch.randn(chunks, args.chunk, args.negatives)

    def timed(fn: Any) -> tuple[float, torch.Tensor, torch.Tensor, torch.Tensor]:
        best = float("inf")
        for _ in range(args.repeats):
            q, c = q0.clone().requires_grad_(), c0.clone().requires_grad_()
            start = time.perf_counter()
            scores = fn(q, c)
            (scores * weights).sum().backward()
            best = min(best, time.perf_counter() - start)
        assert q.grad is not None and c.grad is not None
        return best, scores.detach(), q.grad, c.grad

    base, s0, gq0, gc0 = timed(lambda q, c: reference_match(None, q, c))  # type: ignore[arg-type]
    print(f"reference (cdist): {base * 1000:.1f} ms")
    for tile in [*args.tiles, "compiled"]:
        rotate_distance.KERNELS.enabled = tile == "compiled"
        if isinstance(tile, int):
            rotate_distance.TILE_ELEMENTS = tile
        else:  # the first call compiles (or loads Inductor's cached kernels)
            start = time.perf_counter()
            rotate_distance.rotate_distances(q0.requires_grad_(), c0).sum().backward()
            print(f"compiled: first call {time.perf_counter() - start:.1f} s")
            q0.requires_grad_(False)
        spent, s1, gq1, gc1 = timed(rotate_distance.rotate_distances)
        error = max((a - b).abs().max().item() for a, b in [(s0, s1), (gq0, gq1), (gc0, gc1)])
        print(f"{tile}: {spent * 1000:.1f} ms ({base / spent:.1f}x), max |diff| {error:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["train", "micro"])
    parser.add_argument("--dim", type=int, default=400)
    parser.add_argument("--negatives", type=int, default=256)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiles", type=int, nargs="+", default=[1 << 14, 1 << 16, 1 << 18])
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--no-compile", action="store_true", help="RotatE through the tiles")
    args = parser.parse_args()
    (train if args.mode == "train" else micro)(args)


if __name__ == "__main__":
    main()
