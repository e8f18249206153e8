"""What the API accepts at most, checked before anything else reads a request.

* **Nesting**: a JSON body nested deeper than :data:`MAX_JSON_DEPTH` arrays and objects is a
  400 (``too_deep``) before it is decoded (the decoder recurses once per level).
* **Integers** in query parameters and headers are ASCII digits only (no sign, no
  underscores, no spaces, no other scripts' digits) and at most :data:`MAX_INTEGER` (SQLite's
  largest): anything else is a 400 naming the parameter.
* **Free text** (``task``, ``system``, ``pipeline.goal``, ``folder``, ``scenario``) is at most
  ``daemon.max_task_chars`` characters: a 422 naming the field. ``folder`` is at most
  ``daemon.max_folder_chars`` (4,096, Linux's ``PATH_MAX``) besides: resolving a 200,000
  character path took seconds of the event loop (a ``lstat`` per component).
"""

from __future__ import annotations

import itertools
import re
from typing import Final

from orchestrator.config import DaemonSettings
from orchestrator.daemon.errors import ApiError
from orchestrator.daemon.schemas import RunRequest

__all__ = [
    "INTEGER_PATTERN",
    "MAX_INTEGER",
    "MAX_JSON_DEPTH",
    "check_depth",
    "check_text_lengths",
    "parse_integer",
]

MAX_JSON_DEPTH: Final = 32
"""The deepest a request body may nest arrays and objects."""
MAX_INTEGER: Final = 2**63 - 1
"""The largest integer a query parameter or header may carry (SQLite's largest)."""
INTEGER_PATTERN: Final = "^[0-9]{1,19}$"
"""The form of an integer parameter (the OpenAPI document publishes it)."""

_DIGITS: Final = re.compile(r"[0-9]+")
_MAX_DIGITS: Final = len(str(MAX_INTEGER))
# A JSON string, closing quote optional: it never fails, so the scan stays linear.
_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_STEP: Final = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


def check_depth(body: bytes) -> None:
    """Refuse ``body`` if it nests arrays and objects deeper than :data:`MAX_JSON_DEPTH`
    (outside strings). A body with at most that many opening brackets is let through
    without a scan.

    :raises ApiError: 400 ``too_deep``.
    """
    if body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:
        return
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0) > MAX_JSON_DEPTH:
        raise ApiError(
            400,
            "too_deep",
            f"the body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep",
        )


def parse_integer(value: str, name: str, *, low: int = 0, high: int = MAX_INTEGER) -> int:
    """``value`` as an integer from ``low`` to ``high``: ASCII digits only.

    :raises ApiError: 400 ``bad_query`` naming ``name``.
    """
    if _DIGITS.fullmatch(value) is None:
        raise ApiError(
            400, "bad_query", f"{name} must be an integer in ASCII digits (0-9)", key=name
        )
    number = int(value) if len(value) <= _MAX_DIGITS else None  # int() of 5,000 digits: slow
    if number is None or not low <= number <= high:
        raise ApiError(400, "bad_query", f"{name} must be between {low} and {high}", key=name)
    return number


def check_text_lengths(request: RunRequest, settings: DaemonSettings) -> None:
    """Refuse a request whose free-text fields are longer than ``settings.max_task_chars``
    characters, or whose ``folder`` is longer than ``settings.max_folder_chars``.

    :raises ApiError: 422 ``too_long`` naming the field.
    """
    pipeline = request.pipeline
    task_limit = (settings.max_task_chars, "daemon.max_task_chars")
    fields = (
        ("folder", request.folder, (settings.max_folder_chars, "daemon.max_folder_chars")),
        ("task", request.task, task_limit),
        ("system", request.system, task_limit),
        ("pipeline.goal", pipeline.goal if pipeline is not None else None, task_limit),
        ("folder", request.folder, task_limit),
        ("scenario", request.scenario, task_limit),
    )
    for key, text, (limit, setting) in fields:
        if text is not None and len(text) > limit:
            raise ApiError(
                422,
                "too_long",
                f"`{key}` is {len(text)} characters long; the limit is {limit} ({setting})",
                key=key,
            )
