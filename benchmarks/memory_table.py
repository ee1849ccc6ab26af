"""Peak memory per rank of one Hugging Face Llama under each layout: at start (the model
built, laid out and materialised, before step 1) and over the whole run (training with
AdamW: gradients and optimizer state included).

    ../shared/tools/one-at-a-time .venv/bin/python benchmarks/memory_table.py

Every job runs as torchrun would start it (one process per rank, `tests/cgroup_ranks.py`);
"at start" is the peak resident memory each rank logs when its model is ready, "peak" the
process's maximum resident set (`wait4`). The model: width 768, 8 blocks, MLP 4x, vocab 256
(75M parameters; parameters + gradients + Adam's moments = 1.2 GB in float32), batch 8 of
32 tokens, 3 steps. Prints a markdown table for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import re
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
    ("fully_sharded 4", {"type": "fully_sharded", "degree": 4}, 4),
    ("tensor_parallel 2", {"type": "tensor_parallel", "degree": 2}, 2),
    ("pipeline 2", {"type": "pipeline", "stages": 2, "microbatches": 2}, 2),
    ("hybrid data 2 x tensor 2", {"type": "hybrid", "mesh": {"data": 2, "tensor": 2}}, 4),
]
READY = re.compile(
    r"model ready: ([\d.]+) MiB of parameters on this rank, peak resident memory so far "
    r"(\d+) MiB"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="labels of the layouts to measure besides local (e.g. 'pipeline 2')",
    )
    args = parser.parse_args()
    rows = []
    layouts = [row for row in LAYOUTS if args.only is None or row[0] in ("local", *args.only)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for label, strategy, ranks in layouts:
            name = label.replace(" ", "-")
            path = llama_job(folder, name, strategy, args.layers, args.width, steps=3)
            exits = run_ranks(path, ranks)
            if any(e.code != 0 for e in exits):
                sys.exit(f"{label} failed:\n{rank_logs(path)}")
            starts, params = [], []
            for rank in range(ranks):
                log = (folder / "runs" / name / "logs" / f"rank-{rank}.log").read_text()
                found = READY.search(log)
                assert found is not None, f"{label}: rank {rank} logged no 'model ready'"
                params.append(float(found.group(1)))
                starts.append(int(found.group(2)))
            peaks = [e.peak_rss_bytes / 2**20 for e in exits]
            rows.append((label, ranks, params, starts, peaks))
            print(f"{label}: parameters {params} MiB, start {starts} MiB, peak {peaks}", flush=True)
    print("\n| layout | ranks | parameters per rank (MiB) | at start, max over ranks (MiB) "
          "| peak, max over ranks (MiB) | peak / local's |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    local_peak = max(rows[0][4])
    for label, ranks, params, starts, peaks in rows:
        print(
            f"| {label} | {ranks} | {max(params):.1f} | {max(starts)} | {max(peaks):.0f} "
            f"| {max(peaks) / local_peak:.2f} |"
        )


if __name__ == "__main__":
    main()
