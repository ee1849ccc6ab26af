"""A communication thread: runs reductions one after another, beside the backward pass.

Algorithms made of dependent point-to-point rounds (a ring's 2(n-1) steps, a
tree's levels, compression's two all-reduces) cannot be a single asynchronous
call. Each aggregator that needs one owns a thread that takes buckets in the
order they were started, so every rank issues the same operations in the same
order, while the main thread goes on computing gradients. The waits release
the GIL (gloo waits and tensor arithmetic run outside Python).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class JobTimeout(RuntimeError):
    """A reduction did not finish in time (its own operations carry their own timeouts)."""


class Pending:
    """The handle of a submitted job: `wait()` returns once it ran, or raises what it raised."""

    def __init__(self, what: str, timeout_s: float) -> None:
        self.what = what
        self.timeout_s = timeout_s
        self._done = threading.Event()
        self._error: BaseException | None = None

    def _finish(self, error: BaseException | None) -> None:
        self._error = error
        self._done.set()

    def wait(self) -> None:
        if not self._done.wait(self.timeout_s):
            raise JobTimeout(f"{self.what}: not finished after {self.timeout_s:g} s (timed out)")
        if self._error is not None:
            raise self._error


class CommThread:
    """One background thread running submitted jobs in order.

    After a job fails, the communication state between ranks is unknown (a peer
    may be gone), so every later job fails with the same error instead of
    talking to peers out of step.
    """

    def __init__(self, name: str, timeout_s: float) -> None:
        self.name = name
        # a job's own operations time out after timeout_s; the handle waits a little longer
        self.timeout_s = timeout_s * 2 + 30.0
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Pending]] = queue.SimpleQueue()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], Any], what: str) -> Pending:
        pending = Pending(what, self.timeout_s)
        self._jobs.put((job, pending))
        return pending

    def _run(self) -> None:
        while True:
            job, pending = self._jobs.get()
            if self._failed is not None:
                pending._finish(self._failed)
                continue
            try:
                job()
            except BaseException as exc:  # handed to the waiting thread, which raises it
                self._failed = exc
                pending._finish(exc)
            else:
                pending._finish(None)
