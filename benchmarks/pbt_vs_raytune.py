"""shoal `population_based` vs Ray Tune's `PopulationBasedTraining`, side by side.

The same task (shoal's synthetic 8-class problem and MLP, SGD with momentum 0.9,
batch 128), the same population (8 members on 2 CPU workers), the same budget
(10 generations of 50 steps: 500 steps per member), the same search space (lr
log-uniform in [1e-3, 1], weight decay log-uniform in [1e-6, 1e-2]) and the same
exploit/explore (the bottom quarter copies the top quarter; values x0.8 or x1.2;
synchronous generations). Ray Tune runs the same training step in a function
trainable, with the data shared through its object store and a checkpoint per
generation (which its PBT needs to copy members).

Ray Tune runs with `reuse_actors=True` (its documented remedy for the cost of
restarting trial actors; `--ray-defaults` adds a run with its default, False).
Each contender runs in a fresh Python process, alternating, `--rounds` times;
round k seeds both (shoal's train.seed, Ray's variant generator) with k.
Reported per run: the best member's final validation accuracy, the wall time
(from the moment the contender starts, including Ray's start-up and shutdown or
shoal's worker processes), and the training compute: the seconds every member
spent in training steps and evaluation, measured the same way in both. Overhead
is wall time minus compute / 2 (two workers compute in parallel).

    .venv/bin/python benchmarks/pbt_vs_raytune.py --rounds 3

Ray Tune is a benchmark-only dependency: `pip install -c torch-pin.txt "ray[tune]"`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

POPULATION, WORKERS, INTERVAL, GENERATIONS = 8, 2, 50, 10
DATA = {"samples": 20000, "features": 32, "informative": 8, "classes": 8, "seed": 0}
HIDDEN = [256, 256]
BATCH, MOMENTUM = 128, 0.9
LR, WEIGHT_DECAY = (1e-3, 1.0), (1e-6, 1e-2)


def run_shoal(workdir: Path, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    import shoal

    results = shoal.train(
        {
            "task": {"type": "classification", "data": DATA, "model": {"hidden": HIDDEN}},
            "strategy": {
                "type": "population_based",
                "population_size": POPULATION,
                "workers": WORKERS,
                "ready_interval": INTERVAL,
                "generations": GENERATIONS,
                "exploit": {"method": "truncation", "fraction": 0.25},
                "explore": {"method": "perturbation", "factor": 0.2},
                "search_space": {
                    "lr": {"kind": "log", "low": LR[0], "high": LR[1]},
                    "weight_decay": {
                        "kind": "log",
                        "low": WEIGHT_DECAY[0],
                        "high": WEIGHT_DECAY[1],
                    },
                },
            },
            "train": {
                "max_steps": INTERVAL * GENERATIONS,
                "batch_size": BATCH,
                "seed": seed,
                "optimizer": {"kind": "sgd", "lr": 0.1, "momentum": MOMENTUM},
            },
            "checkpoint": {"keep_last": 2},
            "run": {"dir": str(workdir), "name": "shoal", "threads_per_worker": 1},
            "monitor": {"progress": "off"},
        }
    )
    wall = time.perf_counter() - started
    times = results["time_s"]
    return {
        "score": results["best"]["score"],
        "wall_s": wall,
        "compute_s": times["compute"] + times["evaluation"],
    }


def _ray_trainable(config: dict[str, Any], data: Any) -> None:
    """One Ray Tune trial: the step shoal's Learner takes, 50 per report, checkpoint each report."""
    import torch
    import torch.nn.functional as F
    from ray import tune

    from shoal.tasks.classification.config import MLPConfig
    from shoal.tasks.classification.model import build_mlp
    from shoal.training.batching import EpochPlan

    torch.set_num_threads(1)
    train_x, train_y, valid_x, valid_y = data
    torch.manual_seed(config["seed"])
    model = build_mlp(MLPConfig(hidden=HIDDEN), train_x.shape[1], DATA["classes"])
    optimizer = torch.optim.SGD(
        model.parameters(), lr=config["lr"], momentum=MOMENTUM, weight_decay=config["weight_decay"]
    )
    step = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            state = torch.load(Path(folder) / "state.pt", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
        for group in optimizer.param_groups:  # the explored hyperparameters
            group["lr"], group["weight_decay"] = config["lr"], config["weight_decay"]
    per_epoch = -(-len(train_y) // BATCH)
    while True:
        started = time.perf_counter()
        model.train()
        for _ in range(INTERVAL):
            epoch, index = divmod(step, per_epoch)
            batch = EpochPlan(len(train_y), BATCH, epoch, config["seed"]).global_batch(index)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(train_x[batch]), train_y[batch])
            loss.backward()
            optimizer.step()
            step += 1
        model.eval()
        with torch.no_grad():
            accuracy = float((model(valid_x).argmax(1) == valid_y).float().mean())
        compute = time.perf_counter() - started
        with tempfile.TemporaryDirectory() as folder:
            torch.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                Path(folder) / "state.pt",
            )
            tune.report(
                {"accuracy": accuracy, "compute_s": compute, "step": step},
                checkpoint=tune.Checkpoint.from_directory(folder),
            )


def run_ray(workdir: Path, seed: int, reuse_actors: bool = True) -> dict[str, Any]:
    started = time.perf_counter()
    import ray
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from shoal.tasks.classification.config import SyntheticDataConfig
    from shoal.tasks.classification.data import make_synthetic

    samples = make_synthetic(SyntheticDataConfig(**DATA))
    data = (samples.train.fetch(slice(None)), samples.valid.fetch(slice(None)))  # type: ignore[union-attr,arg-type]
    ray.init(
        num_cpus=WORKERS,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",  # loopback only, as shoal's own workers
    )
    try:
        space = {
            "lr": tune.loguniform(*LR),
            "weight_decay": tune.loguniform(*WEIGHT_DECAY),
        }
        pbt = PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=1,
            hyperparam_mutations=space,
            quantile_fraction=0.25,
            resample_probability=0.0,
            perturbation_factors=(1.2, 0.8),
            synch=True,
        )
        trainable = tune.with_resources(
            tune.with_parameters(_ray_trainable, data=(*data[0], *data[1])), {"cpu": 1}
        )
        tuner = tune.Tuner(
            trainable,
            param_space={**space, "seed": tune.randint(0, 2**31 - 1)},
            tune_config=tune.TuneConfig(
                scheduler=pbt,
                num_samples=POPULATION,
                metric="accuracy",
                mode="max",
                search_alg=BasicVariantGenerator(random_state=seed),
                # Ray's default (False) starts a new actor process whenever a paused trial
                # resumes, which synchronous PBT on fewer slots than trials does every
                # generation; reusing actors is Ray's documented remedy
                reuse_actors=reuse_actors,
            ),
            run_config=tune.RunConfig(
                name="ray",
                storage_path=str(workdir),
                stop={"training_iteration": GENERATIONS},
                checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
                verbose=0,
            ),
        )
        grid = tuner.fit()
        finals = [r.metrics["accuracy"] for r in grid if r.metrics]
        compute = sum(float(r.metrics_dataframe["compute_s"].sum()) for r in grid)
    finally:
        ray.shutdown()
    return {"score": max(finals), "wall_s": time.perf_counter() - started, "compute_s": compute}


def _child(contender: str, seed: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        if contender == "shoal":
            result = run_shoal(Path(folder), seed)
        else:
            result = run_ray(Path(folder), seed, reuse_actors=contender == "ray")
        print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--ray-defaults",
        action="store_true",
        help="also run Ray Tune with its default reuse_actors = False (slow: minutes per run)",
    )
    parser.add_argument("--child", choices=["shoal", "ray", "ray-defaults"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.seed)
        return
    contenders = ["shoal", "ray", *(["ray-defaults"] if args.ray_defaults else [])]
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in contenders}
    for round_ in range(1, args.rounds + 1):
        for contender in contenders:
            done = subprocess.run(
                [sys.executable, __file__, "--child", contender, "--seed", str(round_)],
                capture_output=True,
                text=True,
                check=False,
            )
            line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"{contender} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
            result = json.loads(line.removeprefix("RESULT "))
            result["overhead_s"] = result["wall_s"] - result["compute_s"] / WORKERS
            runs[contender].append(result)
            print(
                f"round {round_} {contender:12s}: best accuracy {result['score']:.4f}  "
                f"wall {result['wall_s']:6.1f} s  compute {result['compute_s']:6.1f} s  "
                f"overhead {result['overhead_s']:6.1f} s",
                flush=True,
            )
    median = {
        c: {
            k: statistics.median(r[k] for r in rs)
            for k in ("score", "wall_s", "compute_s", "overhead_s")
        }
        for c, rs in runs.items()
    }
    for c, m in median.items():
        print(
            f"median {c:12s}: best accuracy {m['score']:.4f}  wall {m['wall_s']:.1f} s  "
            f"compute {m['compute_s']:.1f} s  overhead {m['overhead_s']:.1f} s"
        )
    s = median["shoal"]
    for name in contenders[1:]:
        r = median[name]
        print(
            f"{name} vs shoal: accuracy shoal - {name} = {s['score'] - r['score']:+.4f}; "
            f"wall {name} / shoal = {r['wall_s'] / s['wall_s']:.2f}; "
            f"overhead {name} / shoal = {r['overhead_s'] / s['overhead_s']:.2f}"
        )


if __name__ == "__main__":
    main()
