"""How long `shoal report` takes on a long run: a metrics.jsonl of 100k lines.

    .venv/bin/python benchmarks/report_speed.py RUN_DIR [--lines 100000] [--repeat 3]

Builds a run directory whose metrics.jsonl repeats RUN_DIR's own `train` records
(a real run's fields: per-rank phases, gradient norm, ...) with growing steps and
times until it has `--lines` lines, one `eval` line in every 50 and one
`checkpoint` line in every 1000, with RUN_DIR's config.toml and results.json;
then times `write_report` on it (reading, drawing, writing), best and median of
`--repeat`, and prints the page's size.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from shoal.report import write_report


def long_run(source: Path, folder: Path, lines: int) -> None:
    records = [json.loads(x) for x in (source / "metrics.jsonl").read_text().splitlines() if x]
    train = [r for r in records if r["event"] == "train"]
    evals = [r for r in records if r["event"] == "eval"] or [train[0]]
    if not train:
        sys.exit(f"{source}: no train records to repeat")
    for name in ("config.toml", "results.json"):
        if (source / name).is_file():
            shutil.copy(source / name, folder / name)
    start, step = time.time(), 0
    with open(folder / "metrics.jsonl", "w", encoding="utf-8") as out:
        for index in range(lines):
            if index % 1000 == 999:
                record = {"event": "checkpoint", "step": step, "path": "x", "seconds": 0.01}
            elif index % 50 == 49:
                record = {**evals[index % len(evals)], "step": step}
            else:
                step += 10
                record = {**train[index % len(train)], "step": step}
            record["time"] = start + step * 0.01
            out.write(json.dumps(record) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a finished run whose records are repeated")
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "long-run"
        folder.mkdir()
        long_run(args.run_dir, folder, args.lines)
        size = (folder / "metrics.jsonl").stat().st_size
        seconds = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            page = write_report([folder], Path(tmp) / "report.html")
            seconds.append(time.perf_counter() - started)
        print(
            f"{args.lines} lines ({size / 2**20:.1f} MiB of metrics.jsonl): report in "
            f"best {min(seconds):.2f} s, median {statistics.median(seconds):.2f} s "
            f"(runs: {', '.join(f'{s:.2f}' for s in seconds)}); "
            f"page {page.stat().st_size / 2**10:.0f} KiB"
        )


if __name__ == "__main__":
    main()
