"""Refusals of fleet operations."""

from __future__ import annotations

from orchestrator.daemon.errors import ApiError

__all__ = ["ClusterError"]


class ClusterError(ApiError):
    """A fleet operation refused: ``status`` is the HTTP status that fits, ``code`` a word,
    ``key`` the request's offending field if there is one (the API answers it as any
    :class:`ApiError`)."""
