"""What `[train] activation_checkpointing` and `[train] compile` cost and save: peak memory
per rank and training speed of one Hugging Face Llama, with and without each option, under
`local` and `fully_sharded` 2, side by side in one run.

    ../shared/tools/one-at-a-time .venv/bin/python benchmarks/block_options.py

Every job runs as torchrun would start it (`tests/cgroup_ranks.py`: one process per rank,
one thread each); "peak" is the process's maximum resident set (`wait4`), the largest over
the ranks. Speed is the median of the per-step samples/s that the run logs, past the first
`--warmup` steps (compile's first steps compile). The model: width 256, 6 blocks, MLP 4x,
windows of 256 bytes, batch 8 - small parameters, large activations, where checkpointing
matters. Prints a markdown table for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cgroup_ranks import llama_job, rank_logs, run_ranks  # noqa: E402

LAYOUTS: list[tuple[str, dict[str, Any], int]] = [
    ("local", {"type": "local"}, 1),
    ("fully_sharded 2", {"type": "fully_sharded", "degree": 2}, 2),
]
OPTIONS: list[tuple[str, dict[str, bool]]] = [
    ("plain", {}),
    ("activation checkpointing", {"activation_checkpointing": True}),
    ("compile", {"compile": True}),
    ("both", {"activation_checkpointing": True, "compile": True}),
]


def train_records(run: Path) -> list[dict[str, Any]]:
    """The run's per-step training records."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("event") == "train"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--no-compile", action="store_true", help="leave the compile rows out")
    args = parser.parse_args()
    options = [o for o in OPTIONS if not (args.no_compile and o[1].get("compile"))]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for layout, strategy, ranks in LAYOUTS:
            for option, train in options:
                name = f"{layout}-{option}".replace(" ", "-")
                path = llama_job(
                    folder, name, strategy, args.layers, args.width, args.steps,
                    context=args.context, train=train,
                    monitor={"log_every_steps": 1},
                )  # fmt: skip
                exits = run_ranks(path, ranks)
                if any(e.code != 0 for e in exits):
                    sys.exit(f"{layout} {option} failed:\n{rank_logs(path)}")
                peak = max(e.peak_rss_bytes for e in exits) / 2**20
                records = train_records(folder / "runs" / name)
                speed = statistics.median(
                    r["samples_per_s"] for r in records if r["step"] > args.warmup
                )
                rows.append((layout, option, peak, speed, records[-1]["loss"]))
                print(f"{layout} / {option}: {peak:.0f} MiB, {speed:.1f} samples/s", flush=True)
    print("\n| layout | option | peak per rank (MiB) | vs plain | samples/s | vs plain "
          "| last loss |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    plain: dict[str, tuple[float, float]] = {}
    for layout, option, peak, speed, loss in rows:
        base = plain.setdefault(layout, (peak, speed))
        print(
            f"| {layout} | {option} | {peak:.0f} | {peak / base[0]:.2f} | {speed:.1f} "
            f"| {speed / base[1]:.2f} | {loss:.5f} |"
        )


if __name__ == "__main__":
    main()
