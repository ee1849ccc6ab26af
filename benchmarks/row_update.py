"""The parameter server's row update: `index_add_` with a scaled source vs with `alpha`.

On CPU, `Tensor.index_add_` with any alpha but 1 adds the rows one at a time
(one kernel launch per index); with alpha 1 it takes the vectorised scatter path.
The row optimizers (`strategies/parameter_server/row_optimizers.py`) therefore
scale the source and never pass alpha. This measures, side by side in one
process, each optimizer's shipped `apply` and the same update written with
alpha (the earlier form), on `--updated` unique rows of a `--rows` x `--dim` table
(5M x 64 by default: kge_vs_pbg.py's synthetic graph), fresh random rows every
call so that no call finds its rows in cache; and the bare `index_add_` both ways.
One torch thread. Prints the median and tenth-percentile time per update, the
ratio, and the largest difference between the two forms' tables.

    .venv/bin/python benchmarks/row_update.py [--rows 5000000] [--dim 64] [--updated 3000]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable

import torch

from shoal.strategies.parameter_server.config import (
    LazyAdamConfig,
    RowAdagradConfig,
    RowOptimizerConfig,
    RowSGDConfig,
)
from shoal.strategies.parameter_server.row_optimizers import RowOptimizer, build_row_optimizer

Update = Callable[[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor], object]


def with_alpha(optimizer: RowOptimizer) -> Update:
    """The optimizer's update as written before: the scale passed as index_add_'s alpha."""
    config = optimizer.config
    lr = config.lr

    def sgd(table: torch.Tensor, state: dict, index: torch.Tensor, grad: torch.Tensor) -> None:
        table.index_add_(0, index, grad, alpha=-lr)

    def adagrad(table: torch.Tensor, state: dict, index: torch.Tensor, grad: torch.Tensor) -> None:
        assert isinstance(config, RowAdagradConfig)
        state["sum"].index_add_(0, index, grad.pow(2).mean(dim=1))
        scale = lr / (state["sum"][index].sqrt() + config.eps)
        table.index_add_(0, index, grad * scale[:, None], alpha=-1.0)

    steps = [0]

    def lazy_adam(
        table: torch.Tensor, state: dict, index: torch.Tensor, grad: torch.Tensor
    ) -> None:
        assert isinstance(config, LazyAdamConfig)
        beta1, beta2 = config.betas
        steps[0] += 1
        t = steps[0]
        m = state["m"][index].lerp_(grad, 1 - beta1)
        v = state["v"][index].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        state["m"].index_copy_(0, index, m)
        state["v"].index_copy_(0, index, v)
        state["step"].index_fill_(0, index, t)
        step_size = lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)
        table.index_add_(0, index, m.div_(v.sqrt_().add_(config.eps)), alpha=-step_size)

    return {"sgd": sgd, "adagrad": adagrad, "lazy_adam": lazy_adam}[config.kind]


def timed(update: Update, table: torch.Tensor, state: dict, args: argparse.Namespace) -> float:
    """Seconds of one update of fresh random unique rows (drawn outside the timing)."""
    index = torch.randperm(args.rows)[: args.updated].sort().values
    grad = torch.randn(args.updated, args.dim)
    start = time.perf_counter()
    update(table, state, index, grad)
    return time.perf_counter() - start


def compare(name: str, contenders: dict[str, tuple[Update, torch.Tensor, dict]], args) -> None:
    """Alternate the contenders call by call; print median, p10 and the ratio."""
    times: dict[str, list[float]] = {label: [] for label in contenders}
    for _ in range(args.calls):
        for label, (update, table, state) in contenders.items():
            times[label].append(timed(update, table, state, args))
    medians = {label: statistics.median(t) * 1e3 for label, t in times.items()}
    for label, t in times.items():
        p10 = sorted(t)[len(t) // 10] * 1e3
        print(f"  {name:9s} {label:14s} median {medians[label]:7.3f} ms  p10 {p10:7.3f} ms")
    first, second = list(medians)
    print(f"  {name:9s} {second} / {first}: {medians[second] / medians[first]:.2f}x")


def agreement(kind: str, config, args: argparse.Namespace) -> float:
    """Largest difference between the two forms after the same 5 updates of a small table."""
    tables = [torch.randn(1000, args.dim) for _ in range(2)]
    tables[1].copy_(tables[0])
    shipped, before = build_row_optimizer(config), with_alpha(build_row_optimizer(config))
    states = [shipped.new_state(1000, args.dim), shipped.new_state(1000, args.dim)]
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        index = torch.randperm(1000, generator=generator)[:300].sort().values
        grad = torch.randn(300, args.dim, generator=generator)
        shipped.apply(tables[0], states[0], index, grad)
        before(tables[1], states[1], index, grad)
    return float((tables[0] - tables[1]).abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--updated", type=int, default=3000, help="unique rows per update")
    parser.add_argument("--calls", type=int, default=300, help="calls per contender")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"{args.rows:,} x {args.dim} table, {args.updated:,} rows an update, "
        f"{args.calls} calls each, load {os.getloadavg()[0]:.2f}"
    )
    table = torch.randn(args.rows, args.dim)
    compare(
        "index_add",
        {
            "alpha=1": (lambda t, s, i, g: t.index_add_(0, i, g), table, {}),
            "alpha=-0.1": (lambda t, s, i, g: t.index_add_(0, i, g, alpha=-0.1), table, {}),
        },
        args,
    )
    configs: dict[str, RowOptimizerConfig] = {
        "sgd": RowSGDConfig(lr=0.1),
        "adagrad": RowAdagradConfig(lr=0.1),
        "lazy_adam": LazyAdamConfig(lr=0.01),
    }
    for kind, config in configs.items():
        optimizer = build_row_optimizer(config)
        state = optimizer.new_state(args.rows, args.dim)
        compare(
            kind,
            {
                "shipped": (optimizer.apply, table, state),
                "with alpha": (with_alpha(build_row_optimizer(config)), table, state),
            },
            args,
        )
        difference = agreement(kind, config, args)
        print(f"  {kind:9s} largest difference between the forms: {difference:.3g}")
        del state
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
