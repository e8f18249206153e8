"""The one exception a tool raises on purpose: :class:`ToolError`.

Tools report failures as results; raising ``ToolError(kind, message)`` is how a tool's
code says "answer the model with this error text". The executor turns it into a
``ToolResult(is_error=True, error_kind=kind)``. Any other exception becomes an error
result of kind ``exception``; nothing a tool raises reaches the caller.
"""

from __future__ import annotations

from typing import Final

__all__ = ["PATH_ERROR", "ToolError"]

PATH_ERROR: Final = "path does not exist or is outside the folder"
"""The single answer for a path that is missing, outside the folder or invalid."""


class ToolError(Exception):
    """A failure the model should read: ``kind`` labels it, ``message`` explains it."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
