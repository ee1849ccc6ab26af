"""Where a parameter-server step's time goes, at kge_vs_pbg.py's settings: py-spy on every process.

Runs shoal's parameter server as `kge_vs_pbg.py` does (same flags, same defaults)
for `--steps` steps under `py-spy record --subprocesses --threads`, then sorts every
sample of every process and thread into what it was doing, by the innermost shoal or
torch function on its stack. py-spy leaves out idle threads, but it reports a thread
blocked in a lock wait with a timeout (`queue.get(timeout=...)`, `Event.wait`) as
active: such samples are sorted apart as idle ("...: idle"), so the rest is CPU
time. A gloo `recv` is not told apart: its samples are receiving or waiting.

- worker thread: sampling (batch indices, negatives), pull request, pull wait
  (rows not yet there: CPU spent while waiting), forward (the loss), backward,
  push (gradients split by server and sent), other (the trainer loop, metrics);
- server thread: apply (the row optimizer), answer (gathering pulled rows), send,
  and the receive thread: receiving and decoding messages;
- serialization: any frame in the wire format (headers, blobs).

Also printed: the step-time split the workers measure themselves (metrics.jsonl:
compute_s and comm_s, the time blocked on pulled rows) and the servers' apply and
hold times (results.json). py-spy must be installed in this venv
(`.venv/bin/pip install py-spy`; it needs ptrace, as root or with CAP_SYS_PTRACE).

    .venv/bin/python benchmarks/ps_profile.py [--steps 200] [--prepared FOLDER] \
        [kge_vs_pbg.py's flags]
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kge_vs_pbg import build_parser, finish_args, shoal_ps_run

BIN = Path(sys.executable).parent

# (category, pattern on one frame "function (file:line)"), tried from the innermost frame out;
# the serving loop is in endpoint.py (transport.py before issue 18's split): both are matched
SERVING = r"(transport|endpoint)\.py"
CATEGORIES = [
    ("serialization (wire.py)", re.compile(r"\(.*wire\.py:")),
    (
        "server: apply (row optimizer)",
        re.compile(r"^(_apply|apply) \(.*(server|row_optimizers)\.py"),
    ),
    ("server: answer pulls (gather rows)", re.compile(r"^_answer \(.*server\.py")),
    ("server: send replies", re.compile(r"^(_send|_send_all|_flush|_reap) \(.*" + SERVING)),
    (
        "receive thread: gloo recv",
        re.compile(r"^(_receive_loop|_payloads?|read|_close|_from_closed) \(.*" + SERVING),
    ),
    ("receive thread: gloo recv", re.compile(r"^receive \(.*endpoint\.py")),
    (
        "server: other (inbox, clocks)",
        re.compile(r"^(serve|receive|_rejected) \(.*(transport|endpoint|server)\.py"),
    ),
    ("worker: pull wait", re.compile(r"^wait \(.*client\.py")),
    ("worker: push", re.compile(r"^push \(.*client\.py")),
    ("worker: pull request", re.compile(r"^pull \(.*client\.py")),
    (
        "worker: sampling",
        re.compile(r"^(sample|train_batch|global_batch|_global_batch|rows_touched) \("),
    ),
    ("worker: backward", re.compile(r"^backward \(.*torch")),
    ("worker: forward (loss)", re.compile(r"^loss \(.*kge/task\.py")),
    ("evaluation / export", re.compile(r"^(evaluate|export_embeddings|save_artifacts) \(")),
    ("start-up (imports, data, model)", re.compile(r"^(<module>|load_kg|build_model|__init__) \(")),
]


METHOD = re.compile(r"^[\w<>]+\.(?=\w+ \()")  # py-spy names methods "Class.method (file:line)"


IDLE = re.compile(r"^(wait|get) \((threading|queue)\.py:")
ROLES = [  # for an idle wait: whose thread it is
    ("worker: pull wait", re.compile(r"^wait \(.*(client|transport)\.py")),
    ("server thread: idle (inbox empty)", re.compile(r"^serve \(.*" + SERVING)),
    ("heartbeat thread: idle", re.compile(r"heartbeat\.py")),
]


def categorize(frames: list[str]) -> str:
    bare_frames = [METHOD.sub("", f) for f in frames]
    if bare_frames and IDLE.search(bare_frames[-1]):
        for frame in reversed(bare_frames):
            for name, pattern in ROLES:
                if pattern.search(frame):
                    return name
        return "other thread: idle"
    for frame in reversed(frames):
        bare = METHOD.sub("", frame)
        for name, pattern in CATEGORIES:
            if pattern.search(bare):
                return name
    return "other (trainer loop, metrics, logging)"


def breakdown(raw: Path, rate: int) -> dict[str, dict[str, float]]:
    """CPU seconds by process and category from py-spy's raw (collapsed) output; a process
    is named by its innermost "process PID:CMDLINE" frame (py-spy nests children)."""
    table: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        process = [f for f in frames if f.startswith("process ")][-1:] or ["process ?"]
        pid, _, command = process[0].removeprefix("process ").partition(":")
        role = "worker (with its server threads)" if "launch.worker" in command else "launcher"
        table[f"{role} pid {pid}"][categorize(frames)] += int(count) / rate
    return table


def print_breakdown(table: dict[str, dict[str, float]]) -> None:
    for process, categories in sorted(table.items()):
        total = sum(categories.values())
        print(f"{process}: {total:.2f} s sampled")
        for name, seconds in sorted(categories.items(), key=lambda kv: -kv[1]):
            print(f"  {name:40s} {seconds:7.2f} s  {100 * seconds / total:5.1f}%")


def main() -> None:
    parser = build_parser(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps profiled")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--keep", type=Path, default=None, help="copy py-spy's raw output here")
    parser.add_argument("--raw", type=Path, default=None, help="only sort a kept raw output")
    parser.add_argument(
        "--prepared", type=Path, default=None, help="train this prepared graph, not FB15k-237"
    )
    args = finish_args(parser.parse_args())
    if args.raw:
        print_breakdown(breakdown(args.raw, args.rate))
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        raw = work / "pyspy.txt"
        spy = [str(BIN / "py-spy"), "record", "--subprocesses", "--threads", "--format", "raw"]
        spy += ["-r", str(args.rate), "-o", str(raw), "--"]
        sections = None
        if args.prepared:  # a graph of millions: its end-of-run test sampled and short
            evaluation = {"ranking": "sampled", "max_triples": 64}
            sections = {
                "task": {"data": {"prepared": str(args.prepared)}, "evaluation": evaluation}
            }
        run = shoal_ps_run(work, args, "profile", False, args.steps, spy, sections)
        root = work / "runs" / "profile"
        records = [json.loads(x) for x in (root / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in records if r["event"] == "train"]
        results = json.loads((root / "results.json").read_text())
        if args.keep:
            args.keep.write_bytes(raw.read_bytes())
        table = breakdown(raw, args.rate)
    train_s = sum(r["step_s"] for r in steps)
    compute_s = sum(r["compute_s"] for r in steps)
    comm_s = sum(r["comm_s"] for r in steps)
    print(
        f"{args.steps} steps, {run['triples_per_s']:,.0f} triples/s (under py-spy), step time "
        f"{train_s:.2f} s per worker: compute {compute_s:.2f} s, blocked on pulled rows "
        f"{comm_s:.2f} s"
    )
    print(json.dumps(results.get("parameter_server", {}), indent=1)[:3000])
    print_breakdown(table)


if __name__ == "__main__":
    main()
