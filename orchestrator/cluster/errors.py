"""Refusals of fleet operations."""

from __future__ import annotations

__all__ = ["ClusterError"]


class ClusterError(Exception):
    """A fleet operation refused: ``status`` is the HTTP status that fits, ``code`` a word,
    ``key`` the request's offending field if there is one."""

    def __init__(self, status: int, code: str, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.key = key
