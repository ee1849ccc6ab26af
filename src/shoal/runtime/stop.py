"""SIGTERM and SIGINT are a request to stop, not a crash.

Schedulers (Slurm, Kubernetes) preempt with SIGTERM and kill a little later.
A process that receives SIGTERM or SIGINT records the request here; every
training loop consults it at its unit boundaries (the trainer after each step,
federated rounds, population generations), and every rank stops at the same
boundary: the ranks agree on it with a collective they already make (the
trainer piggybacks on the per-step all-reduce of non-finite flags, see
`training/nonfinite.py`), or with one tiny all-reduce per round or generation.
The loop then writes a final checkpoint, records how the run ended (results.json
`"status": "stopped"`, a `stopped` line in metrics.jsonl) and the process exits
with 128 + the signal number (143 for SIGTERM, 130 for SIGINT), however the
signal was delivered.

A second signal, while a stop is under way, ends the process at once
(checkpoints are written atomically, so the newest complete one stays intact).
The same signal again within `DUPLICATE_WINDOW_S` of the first is the same
request delivered twice, not a second one: Slurm signals every process of a job
while shoal's launcher (or torchrun) forwards the signal it got to its workers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from shoal.errors import RunStopped

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DUPLICATE_WINDOW_S = 2.0


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class StopRequest:
    """This process's stop request, and the stop its peers agreed on.

    `signum` is the first stop signal this process received (0: none).
    `record_agreement` stores what a collective agreed on; the loop that made the
    collective takes it with `take_agreed`. `agree(ctx)` is that collective, for
    loops that have no per-step one to piggyback on.
    """

    def __init__(self) -> None:
        self.signum = 0
        self._agreed: int | None = None

    def reset(self) -> None:
        self.signum = 0
        self._agreed = None

    def record_agreement(self, signals: Sequence[int]) -> int:
        """Every rank's signal (0: none), as a collective gathered them: the agreed stop is the
        largest, the same on every rank."""
        agreed = max((int(s) for s in signals), default=0)
        self._agreed = agreed
        return agreed

    def take_agreed(self) -> int | None:
        """The stop agreed by a piggybacked collective since the last call (None: none ran)."""
        agreed, self._agreed = self._agreed, None
        return agreed

    def agree(self, ctx: Any, all_reduce_sum: Callable[[torch.Tensor], Any] | None = None) -> int:
        """Collective over `ctx`'s ranks: the agreed stop signal (0: go on). Without a process
        group, this process's own request. `all_reduce_sum` sums a tensor over the ranks in
        place (default: torch.distributed over `ctx.group`; a strategy may pass its own
        counted channel)."""
        if not (ctx.distributed and ctx.world_size > 1):
            return self.signum
        slots = torch.zeros(ctx.world_size, dtype=torch.int32)
        slots[ctx.rank] = self.signum
        if all_reduce_sum is None:
            on_device = slots.to(ctx.comm_device)
            dist.all_reduce(on_device, group=getattr(ctx, "group", None))
            slots = on_device.cpu()
        else:
            all_reduce_sum(slots)
        self.record_agreement(slots.tolist())
        return self.take_agreed() or 0


#: the request of this process (signal handlers are per process)
STOP = StopRequest()


def stop_record(signum: int, step: int, checkpoint: str | None) -> dict[str, Any]:
    """How a stopped run ended: results.json's `stop` and metrics.jsonl's `stopped` line."""
    return {"signal": signal_name(signum), "step": step, "checkpoint": checkpoint}


def raise_if_stopped(results: dict[str, Any]) -> None:
    """After a loop returned: a stopped run ends the process with 128 + signal."""
    if results.get("status") != "stopped":
        return
    stop = results["stop"]
    signum = int(signal.Signals[stop["signal"]])
    raise RunStopped(signum, describe_stop(stop, results.get("run_dir")))


def describe_stop(stop: dict[str, Any], run_dir: str | None) -> str:
    """'stopped by SIGTERM at step 42; checkpoint: ...; continue with: ...' (one line)."""
    where = f"stopped by {stop['signal']} at step {stop['step']}"
    if stop.get("checkpoint"):
        again = f"; continue with: shoal train --resume {run_dir}" if run_dir else ""
        return f"{where}; final checkpoint: {stop['checkpoint']}{again}"
    return f"{where}; no checkpoint was written"


def _exit_now(log: logging.Logger | None) -> Callable[[int], None]:
    def exit_now(signum: int) -> None:
        if log is not None:
            log.error("second %s: stopping at once", signal_name(signum))
            for handler in log.handlers:
                with contextlib.suppress(Exception):
                    handler.flush()
        os._exit(128 + signum)

    return exit_now


def raise_now(signum: int) -> None:
    """In-process runs: a second signal ends the run by an exception, at once."""
    raise RunStopped(signum, f"stopped at once by a second {signal_name(signum)}")


@contextlib.contextmanager
def stop_on_signals(
    log: logging.Logger | None,
    at_once: Callable[[int], None] | None = None,
    level: int = logging.WARNING,
) -> Iterator[StopRequest]:
    """Turn SIGTERM and SIGINT into a stop request while the block runs (main thread only;
    elsewhere signals keep their handlers). A second signal calls `at_once` (default: exit
    the process with 128 + signal). The request is logged at `level`."""
    STOP.reset()
    if threading.current_thread() is not threading.main_thread():
        yield STOP
        return
    second = at_once or _exit_now(log)
    first_at = [0.0]

    def handle(signum: int, frame: FrameType | None) -> None:
        if STOP.signum:
            if signum == STOP.signum and time.monotonic() - first_at[0] < DUPLICATE_WINDOW_S:
                return  # the same request, delivered directly and forwarded
            second(signum)
            return
        STOP.signum = signum
        first_at[0] = time.monotonic()
        if log is not None:
            log.log(
                level,
                "%s received: stopping at the next step boundary with a checkpoint "
                "(a second signal stops at once)",
                signal_name(signum),
            )

    previous = {s: signal.signal(s, handle) for s in STOP_SIGNALS}
    try:
        yield STOP
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
