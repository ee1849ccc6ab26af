"""Train the FB15k-237 quality configs to their end in chunks that share the machine.

    nohup .venv/bin/python benchmarks/kge_quality.py distmult complex transe rotate \
        > /work/logs/h14-kge-quality.log 2>&1 &

For each model in turn (examples/kge-fb15k237-<model>.toml), repeatedly: take the CPU
lock (`../shared/tools/one-at-a-time`), train for at most --chunk-s seconds
(`timeout -s TERM`), release the lock and sleep --pause-s seconds without it, so that
other jobs waiting for the machine get it. The first chunk starts the run in
RUNS/<model>; every later chunk is `shoal train --resume RUNS/<model>`, which continues
from the newest checkpoint exactly (the configs checkpoint every few hundred steps, so
a chunk that is cut off loses little). A model is done when its run directory holds a
results.json of status "completed"; the driver then prints its test figures and goes
on to the next.
Stopped and restarted, the driver picks every run up where its checkpoints left it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO.parent / "shared" / "tools" / "one-at-a-time"


def finished(run: Path) -> bool:
    """The run reached its end: a results.json whose status is "completed". A chunk cut off
    by its timeout's SIGTERM writes one too, with status "stopped", and goes on next chunk."""
    results = run / "results.json"
    return results.exists() and json.loads(results.read_text()).get("status") == "completed"


def has_checkpoint(run: Path) -> bool:
    return any((run / "checkpoints").glob("step-*"))


def chunk_command(
    model: str, run: Path, chunk_s: int, overrides: list[str], allow_changes: bool = False
) -> list[str]:
    shoal = [str(REPO / ".venv" / "bin" / "shoal"), "train"]
    if has_checkpoint(run):
        shoal += ["--resume", str(run)] + (["--allow-changes"] if allow_changes else [])
    else:
        config = REPO / "examples" / f"kge-fb15k237-{model}.toml"
        shoal += [str(config), "--set", f"run.dir={run.parent}", "--set", f"run.name={run.name}"]
        for override in overrides:
            shoal += ["--set", override]
    shoal += ["--set", "monitor.progress=off"]
    return [str(LOCK), "timeout", "-s", "TERM", str(chunk_s), *shoal]


def train_to_the_end(
    model: str,
    run: Path,
    chunk_s: int,
    pause_s: int,
    overrides: list[str],
    allow_changes: bool = False,
) -> dict[str, object]:
    chunk = failures = 0
    while not finished(run):
        if run.exists() and not has_checkpoint(run):
            shutil.rmtree(run)  # a first chunk cut off before its first checkpoint: start over
        chunk += 1
        command = chunk_command(model, run, chunk_s, overrides, allow_changes)
        print(f"[{time.strftime('%H:%M:%S')}] {model} chunk {chunk}: {' '.join(command)}")
        sys.stdout.flush()
        code = subprocess.run(command, cwd=REPO, check=False).returncode
        print(f"[{time.strftime('%H:%M:%S')}] {model} chunk {chunk} ended with code {code}")
        failures = 0 if code in (0, 124) else failures + 1  # 124: cut off by the timeout
        if failures >= 3:
            raise SystemExit(f"{model}: {failures} chunks in a row failed (last code {code})")
        sys.stdout.flush()
        time.sleep(pause_s)
    results: dict[str, object] = json.loads((run / "results.json").read_text())
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", choices=["transe", "distmult", "complex", "rotate"])
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "quality")
    parser.add_argument("--chunk-s", type=int, default=600, help="longest hold of the CPU lock")
    parser.add_argument("--pause-s", type=int, default=30, help="sleep without the lock")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument(
        "--allow-changes",
        action="store_true",
        help="resume with `shoal train --allow-changes` (a checkpoint written by an older "
        "shoal whose saved config differs in settings that do not change training)",
    )
    args = parser.parse_args()
    for model in args.models:
        run = args.runs.resolve() / model
        results = train_to_the_end(
            model, run, args.chunk_s, args.pause_s, args.overrides, args.allow_changes
        )
        test = results.get("test", {})
        print(
            f"{model}: test {json.dumps(test)}; epochs {results.get('epochs')}; "
            f"train time {results.get('train_time_s')} s; run {run}"
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
