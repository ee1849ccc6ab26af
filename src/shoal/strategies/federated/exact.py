"""The clients' weighted updates summed exactly, so the sum is the same in any order.

Float addition is not associative: a sum over clients taken worker by worker depends
on which worker ran which client. Integers add associatively, so each client's
float64 vector is scaled by 2^k and rounded to int64 on its own, the integers are
summed (on the worker, then over the workers), and the total is scaled back. The
result is the same bits whichever worker ran which client, in which order, and on
however many workers: a balanced or dynamic assignment of clients gives exactly
the static assignment's model.

k is chosen from the round's magnitude bound (the sum over reporters of each
one's largest |value|, all-reduced before the update is), so the total fits in
int64 with room to spare: its resolution is 2^-61 of that bound, far finer than
the float32 the update is applied in.
"""

from __future__ import annotations

import math

import torch

#: the total's bound in units of the resolution: 2^61 leaves 2^62 - 2^61 for rounding
BOUND_BITS = 61


def exponent(magnitude: float) -> int:
    """The k with magnitude x 2^k < 2^BOUND_BITS (0 for a zero or unknown bound)."""
    if magnitude <= 0 or not math.isfinite(magnitude):
        return 0
    return BOUND_BITS - math.frexp(magnitude)[1]


def to_fixed(vector: torch.Tensor, k: int) -> torch.Tensor:
    """round(vector x 2^k) as int64 (scaling by a power of two is exact in float64)."""
    return torch.round(torch.ldexp(vector.double(), torch.tensor(float(k)))).to(torch.int64)


def from_fixed(total: torch.Tensor, k: int) -> torch.Tensor:
    """The float64 value of a sum of `to_fixed` vectors."""
    return torch.ldexp(total.double(), torch.tensor(float(-k)))
