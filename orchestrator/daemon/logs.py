"""Structured logs: one JSON object per line, with the run and trace ids where there is a run.

``logger.info("run accepted", extra={"run_id": …, "trace_id": …})`` becomes
``{"ts": "…Z", "level": "info", "logger": "loopfuse.daemon", "message": "run accepted",
"run_id": "…", "trace_id": "…"}``. Nothing secret is ever passed in ``extra``: tokens stay in
the authenticator and the model key in the environment.
"""

from __future__ import annotations

import itertools
import logging
import sys
import time
from typing import Any, Final, TextIO

import msgspec

__all__ = ["JsonFormatter", "configure_logging"]

_RECORD: Final = logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None).__dict__
_STANDARD: Final = frozenset(_RECORD) | {"message", "asctime", "taskName", "color_message"}
_ENCODER: Final = msgspec.json.Encoder()
_BUILT_IN: Final = len(_RECORD)
"""How many attributes a record gets before its ``extra`` ones (set after them, in order)."""


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line; ``extra`` fields become top-level keys."""

    def __init__(self) -> None:
        super().__init__()
        self._second = -1
        self._stamp = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:  # most lines share their second with the previous one
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        data: dict[str, Any] = {
            "ts": f"{self._stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in itertools.islice(record.__dict__.items(), _BUILT_IN, None):
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return _ENCODER.encode(data).decode()


def configure_logging(level: str, stream: TextIO | None = None) -> None:
    """Send loopfuse's and uvicorn's logs to ``stream`` (stderr) as JSON lines at ``level``."""
    # The lines name no thread or process: the records need not look them up (a thread
    # lookup and a getpid system call per record, two records per run).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("loopfuse", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True
