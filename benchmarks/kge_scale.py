"""The scale curve: synthetic graphs of 1M / 5M / 20M entities and 10x as many edges, trained
by shoal `local`, the parameter server (2 workers x 2 co-located servers, async), the same
with its shards in memory-mapped files (`shard_dir`), and PyTorch-BigGraph (partitioned).

Graphs: `shoal kge synthesize` (power-law degrees, 500 relations, seed 1), written once
into `--data` (default /work/kge-scale-data; reused by later runs; never in git). Every
contender trains the model of `kge_vs_pbg.py` (TransE, L2, row-wise Adagrad lr 0.1,
margin 1, 128 uniform negatives per positive shared by chunks of 64, 1024 edges per
worker and update, 2 workers of 1 thread) at `--dim` (default 64: a 20M x 64 table is
4.8 GiB, and `local`'s element-wise Adagrad state as much again, so every contender fits
20M entities in this machine's 24 GiB beside the other engineers' jobs; dim 100 would
put `local` at 15 GiB). `local` is one process with 2 threads (all cores) and torch's
Adagrad (element-wise state, sparse row gradients).

Measured: training triples/s over `--steps` steps after `--warmup` steps (whole epochs of
200M edges do not fit the time): shoal's step time from metrics.jsonl; PBG trains one
epoch over the first `--pbg-edges` training edges, all buckets, and reports its Hogwild
phases ("Processed N edges in T s"; partition swaps and checkpoints excluded, as shoal's
step time excludes its start) and the wall time of the whole `train()` call (with them).
Peak memory of every process (launcher, forkserver, workers with their server threads;
PBG's parent and its Hogwild pool), sampled by `tree_peaks.py`: VmHWM (peak resident set,
counting the memory-mapped graph and shared memory in every process that touches them)
and the largest anonymous resident set seen.

PBG's partitions (`--pbg-partitions`, default 4 / 8 / 16 by size): PBG partitions to
bound memory (two partitions of the entity table in memory per bucket); at these sizes
the whole table would fit in memory, so this is PBG's out-of-core mode, the counterpart
of `shard_dir`, at the partition counts its documentation suggests for graphs that
outgrow a machine (memory per process falls with P, swaps per epoch grow with P^2).

    ../shared/tools/one-at-a-time .venv/bin/python benchmarks/kge_scale.py \\
        [--sizes 1000000 5000000] [--contenders local shoal-ps shoal-ps-ooc pbg] \\
        [--reuse earlier.json] [--out result.json]

`--reuse` takes the lines of contenders not run now from an earlier result file, so the
shoal side alone is re-run with `--contenders local shoal-ps shoal-ps-ooc --reuse
benchmarks/results/kge_scale.json` and the table still shows PBG.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kge_vs_pbg import build_parser, ensure_pbg_venv, finish_args, pbg_run, shoal_ps_run

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
CONTENDERS = ("local", "shoal-ps", "shoal-ps-ooc", "pbg")
PARTITIONS = {1_000_000: 4, 5_000_000: 8, 20_000_000: 16}
RELATIONS = 500
GRAPH_SEED = 1


# ---------------------------------------------------------------- graphs


def ensure_graph(root: Path, entities: int, triples: int) -> Path:
    """The prepared synthetic graph, written by `shoal kge synthesize` on first use."""
    folder = root / f"e{entities}-t{triples}-r{RELATIONS}-s{GRAPH_SEED}"
    if not (folder / "manifest.json").exists():
        command = [str(BIN / "shoal"), "kge", "synthesize", "--entities", str(entities)]
        command += ["--relations", str(RELATIONS), "--triples", str(triples)]
        command += ["--seed", str(GRAPH_SEED), "--force", str(folder)]
        subprocess.run(command, check=True)
    return folder


def measured(peaks: Path, limit_mb: int | None = None) -> list[str]:
    """The launcher prefix that samples every process's peak memory into `peaks` (in a
    memory cgroup of `limit_mb` MiB when given)."""
    limit = ["--limit-mb", str(limit_mb)] if limit_mb else []
    return [sys.executable, str(HERE / "tree_peaks.py"), str(peaks), *limit, "--"]


# ---------------------------------------------------------------- shoal


def shoal_sections(
    contender: str, graph: Path, work: Path, args: argparse.Namespace, device: str = "cpu"
) -> dict[str, dict[str, Any]]:
    """What a contender changes in kge_vs_pbg's parameter-server job (`device`: where its
    workers score; the parameter server's rows stay on the CPU)."""
    sections: dict[str, dict[str, Any]] = {
        "task": {
            "data": {"prepared": str(graph)},
            # the end-of-run test: sampled, a few hundred triples (not measured here)
            "evaluation": {"ranking": "sampled", "max_triples": args.eval_triples},
        },
        "monitor": {"log_every_steps": args.log_every, "progress": "off"},
        "run": {"device": device},
    }
    if contender == "local":
        sections["strategy"] = {}
        sections["train"] = {"optimizer": {"kind": "adagrad", "lr": args.lr, "eps": 1e-10}}
        sections["run"]["threads_per_worker"] = args.local_threads
    elif contender == "shoal-ps-ooc":
        sections["strategy"] = {"shard_dir": str(work / "shards")}
    return sections


def steady_rate(metrics: Path, warmup: int) -> tuple[float, int, float]:
    """Triples/s over the logged intervals after step `warmup`; (rate, steps, seconds)."""
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [r for r in records if r["event"] == "train"]
    kept = [r for r in steps if r["step"] > warmup]
    if not kept:
        raise RuntimeError(f"no training interval after step {warmup} in {metrics}")
    seconds = sum(r["step_s"] for r in kept)
    first = max((r["step"] for r in steps if r["step"] <= warmup), default=0)
    return sum(r["samples"] for r in kept) / seconds, kept[-1]["step"] - first, seconds


def read_peaks(peaks: Path) -> dict[str, Any]:
    """tree_peaks.py's file: the processes, and the cgroup's entry when it ran in one."""
    entries = json.loads(peaks.read_text()) if peaks.exists() else []
    found: dict[str, Any] = {"processes": [e for e in entries if e["role"] != "cgroup"]}
    for entry in entries:
        if entry["role"] == "cgroup":
            found["cgroup"] = entry
    return found


def shoal_line(
    contender: str,
    graph: Path,
    work: Path,
    args: argparse.Namespace,
    peaks: Path,
    device: str = "cpu",
) -> dict[str, Any]:
    name = f"{contender}-{device}-{graph.name}"
    metrics = work / "runs" / name / "metrics.jsonl"
    started = time.perf_counter()
    ended = None
    try:
        report = shoal_ps_run(
            work,
            args,
            name,
            False,
            max_steps=args.warmup + args.steps,
            launcher=measured(peaks, args.limit_mb),
            sections=shoal_sections(contender, graph, work, args, device),
        )
    except RuntimeError as error:  # killed after the measured steps: the rate still counts
        if not metrics.exists() or steady_rate(metrics, 0)[1] < args.warmup + args.steps:
            raise
        report, ended = {}, str(error).strip().splitlines()[-1][:300]
    rate, steps, seconds = steady_rate(metrics, args.warmup)
    line = {
        "triples_per_s": rate,
        "measured_steps": steps,
        "measured_s": seconds,
        "run_wall_s": time.perf_counter() - started,
        "parameter_server": report.get("parameter_server"),
    }
    if ended:
        line["ended_after_measuring"] = ended
    return line


# ---------------------------------------------------------------- PBG


def pbg_line(
    graph: Path, entities: int, work: Path, args: argparse.Namespace, peaks: Path
) -> dict[str, Any]:
    parts = args.pbg_partitions.get(entities, PARTITIONS.get(entities, 16))
    settings = {
        "prepared": str(graph),
        "partitions": parts,
        "train_edges": args.pbg_edges,
        "export": False,
    }
    started = time.perf_counter()
    launcher = measured(peaks, args.limit_mb)
    report = pbg_run(work, args, "dynamic", f"pbg-{graph.name}", False, settings, launcher)
    return {
        "triples_per_s": report["triples_per_s"],
        "wall_triples_per_s": args.pbg_edges / report["train_call_wall_s"],
        "partitions": parts,
        "measured_edges": args.pbg_edges,
        "measured_s": report["train_s"],
        "train_call_wall_s": report["train_call_wall_s"],
        "run_wall_s": time.perf_counter() - started,
    }


# ---------------------------------------------------------------- table


def memory_cell(processes: list[dict[str, Any]], key: str) -> str:
    """Per process, largest first: `role size`; tiny helpers (< 50 MiB) left out."""
    shown = sorted((p for p in processes if p[key] >= 50), key=lambda p: -p[key])
    return ", ".join(f"{p['role']} {p[key]:,.0f}" for p in shown)


def table(lines: list[dict[str, Any]]) -> str:
    rows = [
        "| entities | edges | contender | triples/s | peak RSS per process (MiB) | "
        "sum | peak anonymous per process (MiB) | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for line in lines:
        device = line.get("device", "cpu")
        contender = line["contender"] + (f" on {device}" if device != "cpu" else "")
        if "error" in line:
            group = line.get("cgroup", {})
            why = f"failed: {line['error']}"
            if group.get("oom_kills"):
                why = f"does not fit: killed by the kernel at the {group['limit_mib']:,} MiB limit"
            seen = memory_cell(line["processes"], "peak_rss_mib")
            rows.append(
                f"| {line['entities']:,} | {line['edges']:,} | {contender} | {why} | "
                f"{seen} | | | {line['load_before']:.2f} |"
            )
            continue
        rate = f"{line['triples_per_s']:,.0f}"
        if "ended_after_measuring" in line:
            rate += " (then killed at the end of the run"
            rate += f", {line['cgroup']['limit_mib']:,} MiB limit)" if "cgroup" in line else ")"
        if "wall_triples_per_s" in line:
            rate += f" ({line['wall_triples_per_s']:,.0f} with swaps, P={line['partitions']})"
        total = sum(p["peak_rss_mib"] for p in line["processes"])
        rows.append(
            f"| {line['entities']:,} | {line['edges']:,} | {contender} | {rate} | "
            f"{memory_cell(line['processes'], 'peak_rss_mib')} | {total:,.0f} | "
            f"{memory_cell(line['processes'], 'peak_anon_mib')} | {line['load_before']:.2f} |"
        )
    return "\n".join(rows)


def parse_args() -> argparse.Namespace:
    parser = build_parser(__doc__.splitlines()[0])
    parser.set_defaults(dim=64)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 5_000_000])
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--data", type=Path, default=Path("/work/kge-scale-data"))
    parser.add_argument("--steps", type=int, default=200, help="measured, after --warmup")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--local-threads", type=int, default=2)
    parser.add_argument("--eval-triples", type=int, default=256)
    parser.add_argument("--pbg-edges", type=int, default=2_000_000)
    parser.add_argument(
        "--pbg-partitions",
        type=lambda text: dict(tuple(map(int, pair.split("="))) for pair in text.split(",")),
        default={},
        help="ENTITIES=P,... (default 1M: 4, 5M: 8, 20M: 16)",
    )
    parser.add_argument("--reuse", type=Path, default=None, help="earlier --out file")
    parser.add_argument(
        "--limit-mb", type=int, default=None, help="run each contender in a memory cgroup"
    )
    parser.add_argument(
        "--devices",
        nargs="+",
        choices=("cpu", "cuda"),
        default=["cpu"],
        help="run every shoal contender on each (cuda: its workers score on the GPU)",
    )
    return finish_args(parser.parse_args())


def main() -> None:
    args = parse_args()
    if "pbg" in args.contenders:
        args.pbg_python = ensure_pbg_venv()
    lines: list[dict[str, Any]] = []
    for entities in args.sizes:
        graph = ensure_graph(args.data, entities, 10 * entities)
        runs = [(c, d) for c in args.contenders for d in (["cpu"] if c == "pbg" else args.devices)]
        for contender, device in runs:
            work = args.data / "work"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            line: dict[str, Any] = {
                "entities": entities,
                "edges": 10 * entities,
                "contender": contender,
                "device": device,
                "load_before": os.getloadavg()[0],
            }
            peaks = work / "peaks.json"
            try:
                if contender == "pbg":
                    line.update(pbg_line(graph, entities, work, args, peaks))
                else:
                    line.update(shoal_line(contender, graph, work, args, peaks, device))
            except (RuntimeError, subprocess.CalledProcessError) as error:
                line["error"] = str(error).strip().splitlines()[-1][:300]
            line.update(read_peaks(peaks))
            line["load_after"] = os.getloadavg()[0]
            lines.append(line)
            print(json.dumps(line), flush=True)
            shutil.rmtree(work, ignore_errors=True)
    if args.reuse:

        def key(e: dict[str, Any]) -> tuple[int, str, str]:
            return e["entities"], e["contender"], e.get("device", "cpu")

        ran = {key(line) for line in lines}
        earlier = json.loads(args.reuse.read_text())["lines"]
        lines += [e for e in earlier if key(e) not in ran]
        lines.sort(key=lambda e: (e["entities"], CONTENDERS.index(e["contender"])))
    print(table(lines))
    if args.out:
        record = {"args": {k: str(v) for k, v in vars(args).items()}, "lines": lines}
        args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
