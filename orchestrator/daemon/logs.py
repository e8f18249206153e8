"""Structured logs: one JSON object per line, with the run and trace ids where there is a run.

``logger.info("run accepted", extra={"run_id": …, "trace_id": …})`` becomes
``{"ts": "…Z", "level": "info", "logger": "loopfuse.daemon", "message": "run accepted",
"run_id": "…", "trace_id": "…"}``. Nothing secret is ever passed in ``extra``: tokens stay in
the authenticator and the model key in the environment.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Final, TextIO

import msgspec

__all__ = ["JsonFormatter", "configure_logging"]

_STANDARD: Final = frozenset(
    logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None).__dict__
) | {"message", "asctime", "taskName", "color_message"}
_ENCODER: Final = msgspec.json.Encoder()


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line; ``extra`` fields become top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return _ENCODER.encode(data).decode()


def configure_logging(level: str, stream: TextIO | None = None) -> None:
    """Send loopfuse's and uvicorn's logs to ``stream`` (stderr) as JSON lines at ``level``."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("loopfuse", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True
