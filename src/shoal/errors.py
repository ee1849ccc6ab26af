"""Errors a user can cause, kept apart from bugs.

A :class:`ShoalError` is shown as one line (or one line per problem), without a
traceback, and the process exits with :attr:`ShoalError.exit_code`. Anything else
that escapes is a bug in shoal or in user code and keeps its traceback.
"""

from __future__ import annotations

import re

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USER_ERROR = 2
EXIT_HALTED = 3


class PeerFailed(RuntimeError):
    """A failure this rank saw because another rank failed (it died, hung, or gave up a
    collective step): a consequence, which the launcher never names as the cause."""


class ShoalError(Exception):
    """A problem the user can fix: bad config, bad data file, bad command line."""

    exit_code = EXIT_USER_ERROR

    def __init__(self, *lines: str) -> None:
        self.lines = [line for line in lines if line]
        super().__init__("\n".join(self.lines))


class ConfigError(ShoalError):
    """The config file or an override is invalid; one line per problem."""


class DataError(ShoalError):
    """A data file is missing or malformed; the line says `file:line: what`."""


class JobFailed(ShoalError):
    """A training job failed at run time (a worker raised, died or hung)."""

    exit_code = EXIT_FAILURE


class TrainingHalted(ShoalError):
    """Training stopped on purpose, before an update that would corrupt the model.

    Seed 004's "Jidoka": a worker's gradient held NaN or Inf. Every worker stops
    before the optimizer step, so the newest checkpoint is the last good state.
    A distinct exit code tells schedulers not to retry blindly.
    """

    exit_code = EXIT_HALTED


class RunStopped(ShoalError):
    """The run stopped on request (SIGTERM, SIGINT): not a failure.

    Every rank stopped at the same step boundary and a final checkpoint was written
    (unless a second signal ended it at once). The exit code is 128 + the signal
    number, as a shell reports a process ended by that signal.
    """

    def __init__(self, signum: int, *lines: str) -> None:
        super().__init__(*lines)
        self.signum = signum
        self.exit_code = 128 + signum


#: a C++ source location at the start of a backend's message (`[.../pair.cc:534] `)
_SOURCE_LOCATION = re.compile(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*")
#: what torch's gloo wrapper appends to a transport error ("This is typically caused by a
#: remote worker crashing. Check the logs ... GLHF! ..."): advice for its own developers,
#: not a cause (shoal names the peer itself)
_TORCH_ADVICE = re.compile(r"\s*This is typically caused by .*", re.S)


def plain_error(text: str) -> str:
    """`text`'s first line as a user reads it: no C++ source location, no torch advice."""
    lines = _TORCH_ADVICE.sub("", _SOURCE_LOCATION.sub("", text)).strip().splitlines()
    return lines[0].strip() if lines else ""
