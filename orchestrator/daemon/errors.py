"""The daemon's one exception: an API error that becomes a JSON error response.

::

    ApiError (also LoopfuseError)   .status, .code, .message, .key, .headers
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.errors import LoopfuseError

__all__ = ["ApiError"]


class ApiError(LoopfuseError):
    """A request the daemon refuses: ``status`` and a body ``{"error": {code, message, key}}``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.key = key
        self.headers = dict(headers or {})
