"""A negative-sampling step's scoring and loss, compiled where torch.compile works.

Once a step's rows are gathered, what is left is a chain of small tensor ops: each
side's queries, the positives' distances, the chunks' matrix products with the
norms and clamps around them, the loss's hinge or softplus and their weights,
then the backward of each. In eager mode every one of them reads and writes its
(n, K) or (n, width) operands, and at the widths knowledge graphs use that
memory traffic and the per-op dispatch cost more than the matrix products
(a TransE-L2 step of 1024 positives x 128 negatives at dim 64: 5.2 ms eager,
1.4 ms compiled, one thread). Inductor fuses the elementwise work around the
products into a few C++ loop nests.

What is compiled is `side_losses` (negative_sampling.py): the rows it gets are
already gathered and dropped out, so it draws nothing and a compiled step reads the
same random numbers as an eager one. It serves models and losses that declare
their scoring plain torch ops (`compiled_scoring`: shoal's TransE, DistMult,
ComplEx and its four losses; RotatE has kernels of its own, a plugin opts in).

When: where `task.compiled_scoring` says (by default, runs of at least
COMPILE_AFTER_STEPS planned steps: below that the compilation costs more than it
saves); then on CPU, in training (gradients enabled: evaluation never comes
here), within compilation.py's budget of static shapes (a step's shape is its
batch's: the last batch of an epoch is one more; Inductor caches them on disk
for later processes), with its SHOAL_KGE_COMPILE switch and its fallback after a
failure. The compiled and eager steps agree to float rounding, not bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from shoal.tasks.kge.compilation import CompiledKernels

#: the compiled step's functions and shape budget (compilation.py)
KERNELS = CompiledKernels("knowledge-graph scoring", "running eagerly")
#: under `task.compiled_scoring = "auto"`, the planned steps from which a run compiles. A
#: compilation costs 7-10 s per shape with no cache on this project's 2-core machine (2-4 s
#: with Inductor's disk cache) and saves 2.7 ms (dim 64) to 5 ms (dim 200) a step: cold, it
#: pays for itself after 2,000-4,000 steps. The kinships demo (680 steps) took 15 s eager
#: and 35 s compiled from a cold cache.
COMPILE_AFTER_STEPS = 5000


def _shape_key(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """What a static-shape compilation is specialised on: each tensor's shape and dtype,
    each list's length, and plain values (a side given as one bool)."""
    key: list[Any] = []
    for value in args:
        if isinstance(value, torch.Tensor):
            key.append((tuple(value.shape), value.dtype))
        elif isinstance(value, list | tuple):
            key.append(_shape_key(tuple(value)))
        else:
            key.append(value if isinstance(value, bool | int | float | str) else type(value))
    return tuple(key)


def planned(setting: bool | str, steps: int | None) -> bool:
    """Whether a run compiles (`task.compiled_scoring`): as set, or under "auto" when it
    plans at least COMPILE_AFTER_STEPS steps (`steps`: None for no planned end)."""
    if setting != "auto":
        return bool(setting)
    return steps is None or steps >= COMPILE_AFTER_STEPS


def _wanted(model: Any, loss_fn: Any, tensors: list[torch.Tensor]) -> bool:
    return (
        torch.is_grad_enabled()
        and getattr(model, "compiled_scoring", False)
        and getattr(loss_fn, "compiled_scoring", False)
        and all(t.device.type == "cpu" for t in tensors)
    )


def call(
    function: Callable[..., torch.Tensor],
    enabled: bool,
    model: Any,
    loss_fn: Any,
    tensors: list[torch.Tensor],
    *args: Any,
) -> torch.Tensor:
    """`function(model, loss_fn, *args)`, compiled where `enabled` (the run's `planned`) and
    this module say it may be (the tensors among `args` are listed in `tensors`, for the
    device check); eager otherwise."""
    if enabled and _wanted(model, loss_fn, tensors):
        key = (function, type(model), type(loss_fn), _shape_key(args))
        if KERNELS.admit(key):
            out: torch.Tensor | None = KERNELS.run(function, model, loss_fn, *args)
            if out is not None:
                return out
    return function(model, loss_fn, *args)
