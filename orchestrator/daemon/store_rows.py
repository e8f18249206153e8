"""A run's row: :class:`RunRow`, and the columns a read selects (whole, or as a summary)."""

from __future__ import annotations

from typing import Any, Final

import msgspec

__all__ = [
    "COLUMNS",
    "LAST_EVENT",
    "NAMES",
    "SUMMARY_CHARS_PARAMETERS",
    "SUMMARY_COLUMNS",
    "RunRow",
    "read_row",
]


class RunRow(msgspec.Struct, kw_only=True):
    """A run as stored (``request`` and ``result`` are JSON bytes)."""

    id: str
    trace_id: str
    status: str
    on_crash: str
    request: bytes
    request_hash: str
    idempotency_key: str | None = None
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    exit_reason: str | None = None
    cause: str | None = None
    result: bytes | None = None
    last_event: int = 0
    events_dropped: int = 0
    cursor: int = 0


NAMES: Final = RunRow.__struct_fields__
"""The columns of ``runs``: a run row's fields, in the order a read selects them."""
LAST_EVENT: Final = (
    "max(last_event, (SELECT coalesce(max(seq), 0) FROM run_events WHERE run = runs.cursor))"
)
"""A run's last stored event, as read: the row's ``last_event`` is written only with the
row's other changes (a commit that only appends a run's events leaves its row alone, so
it writes no page of ``runs`` for it), the events' index has the newest one."""
COLUMNS: Final = ", ".join(LAST_EVENT if name == "last_event" else name for name in NAMES)


_TEXT: Final = "CAST(request AS TEXT)"
_CUT_TEXTS: Final = ("task", "system", "folder", "scenario", "pipeline.goal")
_SUMMARY_REQUEST: Final = (
    f"CASE WHEN json_valid({_TEXT}) THEN CAST(json_replace({_TEXT}, "
    + ", ".join(f"'$.{key}', substr(json_extract({_TEXT}, '$.{key}'), 1, ?)" for key in _CUT_TEXTS)
    + ", '$.config', json('{}')) AS BLOB) ELSE request END"
)
SUMMARY_CHARS_PARAMETERS: Final = len(_CUT_TEXTS)
_SUMMARY_RESULT: Final = (
    "CASE WHEN result IS NULL THEN NULL "
    "WHEN json_valid(CAST(result AS TEXT)) "
    "AND json_type(CAST(result AS TEXT), '$.simulated') = 'true' "
    "THEN CAST('{\"simulated\":true}' AS BLOB) ELSE CAST('{}' AS BLOB) END"
)
_SUMMARIES: Final = {
    "last_event": LAST_EVENT,
    "request": _SUMMARY_REQUEST,
    "result": _SUMMARY_RESULT,
}
SUMMARY_COLUMNS: Final = ", ".join(_SUMMARIES.get(name, name) for name in NAMES)
""":data:`COLUMNS` with the request and result as summaries (:meth:`Store.list_runs`)."""


def read_row(values: tuple[Any, ...]) -> RunRow:
    fields = dict(zip(NAMES, values, strict=True))
    for blob in ("request", "result"):
        if fields[blob] is not None:
            fields[blob] = bytes(fields[blob])
    return RunRow(**fields)
