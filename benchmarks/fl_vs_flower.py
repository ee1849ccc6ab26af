"""shoal `federated` vs Flower's simulation engine: the same FedAvg problem, side by side.

The same MLP with the same initial weights, the same synthetic data, the same
Dirichlet(0.5) label-skewed partition over 20 clients (computed once by shoal's
partition code and handed to both), FedAvg over all clients, 1 local epoch of
SGD per round, 20 rounds. Both evaluate the global model on the same held-out
set after every round. Each contender runs in a fresh process; they alternate
for `--repeats` repetitions. Printed: accuracy per round (both), wall time per
round (excluding the held-out evaluation), and the ratio of the median round
times. Flower (`flwr[simulation]`, which brings Ray) is a benchmark-only
dependency:

    echo torch==2.13.0 > /tmp/torch-pin.txt
    .venv/bin/pip install -c /tmp/torch-pin.txt "flwr[simulation]"
    .venv/bin/python benchmarks/fl_vs_flower.py [--repeats 3] [--rounds 20] [--workers 2] \
        [--balances static balanced dynamic]

`--balances` runs shoal once per `strategy.balance` (each against the same Flower runs):
static (client c on worker c mod workers), balanced (placed by shard size, longest
first) or dynamic (workers take the next client from a queue).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent


def job(args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """The shoal config; the Flower side reads the same fields."""
    return {
        "task": {
            "type": "classification",
            "data": {
                "samples": args.samples,
                "features": 32,
                "informative": 10,
                "classes": 10,
                "clusters_per_class": 2,
                "seed": 0,
                "valid_fraction": 0.2,
            },
            "model": {"hidden": [128, 128]},
        },
        "strategy": {
            "type": "federated",
            "num_clients": args.clients,
            "workers": args.workers,
            "rounds": args.rounds,
            "local_epochs": 1,
            "balance": args.balance,
            "partition": {"kind": "dirichlet", "alpha": 0.5, "min_samples": 10, "seed": 0},
        },
        "train": {
            "batch_size": args.batch_size,
            "seed": 0,
            "optimizer": {"kind": "sgd", "lr": args.lr},
        },
        "checkpoint": {"at_end": False},
        "run": {"dir": str(run_dir), "name": "shoal"},
        "monitor": {"progress": "off"},
    }


# ---------------------------------------------------------------- shoal
def run_shoal(args: argparse.Namespace, out: Path) -> None:
    import shoal
    from shoal.monitor.metrics import read_metrics

    with tempfile.TemporaryDirectory() as tmp:
        results = shoal.train(job(args, Path(tmp)))
        records = read_metrics(Path(results["run_dir"]) / "metrics.jsonl")
    rounds = [r for r in records if r["event"] == "round"]
    evals = [r for r in records if r["event"] == "eval"]
    out.write_text(
        json.dumps(
            {
                "round_s": [r["round_s"] for r in rounds],
                "accuracy": [r["accuracy"] for r in evals],
            }
        )
    )


# ---------------------------------------------------------------- Flower
def shared_problem(args: argparse.Namespace) -> tuple[Any, Any, list[Any], torch.nn.Module]:
    """Data, partition and initial model exactly as shoal builds them."""
    from shoal.config import load_config
    from shoal.runtime.rng import seed_everything
    from shoal.strategies.federated.partition import dirichlet_shards
    from shoal.tasks.classification.data import make_synthetic
    from shoal.tasks.classification.model import build_mlp

    config = load_config(job(args, Path(".")))
    data = make_synthetic(config.task.data)  # type: ignore[arg-type]
    part = config.strategy.partition  # type: ignore[union-attr]
    shards = dirichlet_shards(
        data.train.all_labels().numpy(), args.clients, part.alpha, part.min_samples, part.seed
    )
    seed_everything(0)
    model = build_mlp(config.task.model, data.input_features(), data.classes())
    return data.train, data.valid, shards, model


def run_flower(args: argparse.Namespace, out: Path) -> None:
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    train, valid, shards, initial = shared_problem(args)
    client_app = ClientApp()

    @client_app.train()
    def local_training(msg: Message, context: Context) -> Message:
        torch.set_num_threads(1)
        client = int(context.node_config["partition-id"])
        shard = torch.as_tensor(shards[client])
        model = shared_problem_model(initial)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        generator = torch.Generator().manual_seed(
            client * 1000 + int(msg.content["config"]["server-round"])
        )
        model.train()
        loss_sum = 0.0
        order = shard[torch.randperm(len(shard), generator=generator)]
        for start in range(0, len(order), args.batch_size):
            x, y = train.fetch(order[start : start + args.batch_size])
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum += float(loss) * len(y)
        metrics = MetricRecord({"train_loss": loss_sum / len(shard), "num-examples": len(shard)})
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
        return Message(content=content, reply_to=msg)

    accuracy: list[float] = []
    marks: list[tuple[float, float]] = []  # (start, end) of each central evaluation

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        started = time.perf_counter()
        model = shared_problem_model(initial)
        model.load_state_dict(arrays.to_torch_state_dict())
        model.eval()
        with torch.no_grad():
            x, y = valid.fetch(torch.arange(len(valid)))
            acc = float((model(x).argmax(1) == y).float().mean())
        if server_round > 0:
            accuracy.append(acc)
        marks.append((started, time.perf_counter()))
        return MetricRecord({"accuracy": acc})

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(
            fraction_train=1.0,
            fraction_evaluate=0.0,
            min_train_nodes=args.clients,
            min_available_nodes=args.clients,
        )
        strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(initial.state_dict()),
            num_rounds=args.rounds,
            evaluate_fn=evaluate,
        )

    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=args.clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    # a round: from the end of the previous evaluation to the start of the next
    round_s = [marks[i + 1][0] - marks[i][1] for i in range(len(marks) - 1)]
    out.write_text(json.dumps({"round_s": round_s, "accuracy": accuracy}))


def shared_problem_model(initial: torch.nn.Module) -> torch.nn.Module:
    import copy

    return copy.deepcopy(initial)


# ---------------------------------------------------------------- driver
def one(contender: str, args: argparse.Namespace) -> dict[str, Any]:
    """`contender`: "flower" or "shoal-<balance>"."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        name, _, balance = contender.partition("-")
        cmd = [sys.executable, __file__, "--only", name, "--out", str(out)]
        cmd += ["--balance", balance or "static"]
        cmd += ["--rounds", str(args.rounds), "--clients", str(args.clients)]
        cmd += ["--workers", str(args.workers), "--samples", str(args.samples)]
        cmd += ["--batch-size", str(args.batch_size), "--lr", str(args.lr)]
        started = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        if done.returncode != 0:
            sys.exit(f"{contender} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
        result: dict[str, Any] = json.loads(out.read_text())
        result["process_s"] = time.perf_counter() - started
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument(
        "--workers", type=int, default=2, help="shoal workers (Flower: 1 CPU per client)"
    )
    parser.add_argument("--samples", type=int, default=25_000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument(
        "--balances", nargs="+", default=["static"], choices=["static", "balanced", "dynamic"]
    )
    parser.add_argument("--balance", default="static", help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=["shoal", "flower"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only == "shoal":
        return run_shoal(args, args.out)
    if args.only == "flower":
        return run_flower(args, args.out)

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}")
    print(f"settings: {vars(args)}")
    contenders = [f"shoal-{b}" for b in args.balances] + ["flower"]
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in contenders}
    for repeat in range(args.repeats):
        for contender in contenders:
            result = one(contender, args)
            results[contender].append(result)
            median = statistics.median(result["round_s"])
            print(
                f"repeat {repeat + 1} {contender}: median round {median:.3f} s, "
                f"final accuracy {result['accuracy'][-1]:.4f}, process {result['process_s']:.1f} s",
                flush=True,
            )
    print("\n| round | " + " | ".join(f"{c} accuracy" for c in contenders) + " | ", end="")
    print(" | ".join(f"{c} round s" for c in contenders) + " |")
    print("|---" * (1 + 2 * len(contenders)) + "|")
    for rnd in range(args.rounds):
        acc = {c: statistics.mean(r["accuracy"][rnd] for r in results[c]) for c in results}
        sec = {c: statistics.median(r["round_s"][rnd] for r in results[c]) for c in results}
        print(
            f"| {rnd + 1} | "
            + " | ".join(f"{acc[c]:.4f}" for c in contenders)
            + " | "
            + " | ".join(f"{sec[c]:.3f}" for c in contenders)
            + " |"
        )
    medians = {c: statistics.median(s for r in results[c] for s in r["round_s"]) for c in results}
    totals = {c: statistics.median(sum(r["round_s"]) for r in results[c]) for c in results}
    process = {c: statistics.median(r["process_s"] for r in results[c]) for c in results}
    print()
    for c in contenders:
        finals = ", ".join(f"{r['accuracy'][-1]:.4f}" for r in results[c])
        versus = (
            ""
            if c == "flower"
            else (
                f"; Flower / {c}: median round {medians['flower'] / medians[c]:.2f}x, "
                f"all rounds {totals['flower'] / totals[c]:.2f}x"
            )
        )
        print(
            f"{c}: median round {medians[c]:.3f} s, all {args.rounds} rounds (first included) "
            f"{totals[c]:.2f} s, whole process {process[c]:.1f} s, final accuracy {finals}{versus}"
        )


if __name__ == "__main__":
    main()
