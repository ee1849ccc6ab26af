"""One log file per rank; warnings and errors of rank 0 also reach the terminal."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

FORMAT = "%(asctime)s rank%(rank)s %(levelname)s %(message)s"


class _WarningsOnly(logging.Filter):
    """Errors are reported once, by whoever ends the job (launcher or CLI); warnings are echoed."""

    def filter(self, record: logging.LogRecord) -> bool:
        return logging.WARNING <= record.levelno < logging.ERROR


class _RankFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


class _LogFile(logging.FileHandler):
    """A rank's log file; when it cannot be written (a full disk), says so once, in one line,
    instead of a traceback per record on the terminal."""

    _warned = False

    def handleError(self, record: logging.LogRecord) -> None:
        if not self._warned:
            self._warned = True
            error = sys.exc_info()[1]
            sys.stderr.write(f"shoal: warning: cannot write {self.baseFilename}: {error}\n")


def worker_logger(rank: int, log_file: Path | None) -> logging.Logger:
    """The logger of this worker: everything to its log file, warnings also to stderr."""
    logger = logging.getLogger(f"shoal.rank{rank}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    rank_filter = _RankFilter(rank)
    if log_file is not None:
        file_handler = _LogFile(log_file, encoding="utf-8")
        file_handler.setFormatter(logging.Formatter(FORMAT))
        file_handler.addFilter(rank_filter)
        logger.addHandler(file_handler)
    console = logging.StreamHandler(sys.stderr)
    console.addFilter(_WarningsOnly())
    console.setFormatter(logging.Formatter("shoal: %(levelname)s: %(message)s"))
    logger.addHandler(console)
    return logger


def close_logger(logger: logging.Logger) -> None:
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
