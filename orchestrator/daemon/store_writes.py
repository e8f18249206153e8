"""The statements a commit writes with: every kind of change (new runs, events, row
updates, checkpoints) in a few multi-row statements of a few sizes each."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from orchestrator.daemon.store_rows import NAMES, RunRow

__all__ = [
    "INSERT_HEAD",
    "UPDATED",
    "UPDATE_HEAD",
    "UPDATE_TAIL",
    "execute_rows",
    "inserted_row",
    "row_updates",
]

_MAX_VARIABLES: Final = 30_000
"""Bound parameters per statement (SQLite's limit is 32,766 since 3.32)."""
_SMALLEST: Final = 4
"""The smallest size class of a multi-row statement."""

UPDATED: Final = (
    "trace_id",
    "status",
    "started_at",
    "ended_at",
    "exit_reason",
    "cause",
    "result",
    "events_dropped",
)
"""The columns :meth:`Store.update_run` sets, in the order of an update row's values."""
INSERT_HEAD: Final = f"INSERT INTO runs ({', '.join(NAMES)}) SELECT * FROM (VALUES "
UPDATE_HEAD: Final = (
    "UPDATE runs SET "
    + ", ".join(
        f"{name} = CASE WHEN v.column2 & {1 << i} THEN v.column{i + 3} ELSE runs.{name} END"
        for i, name in enumerate(UPDATED)
    )
    + f", last_event = max(runs.last_event, v.column{len(UPDATED) + 3})"
    + " FROM (SELECT * FROM (VALUES "
)
UPDATE_TAIL: Final = ") LIMIT ?) AS v WHERE runs.id = v.column1"
"""One statement updates every run a commit touches: a row is ``(id, mask, the values of
:data:`UPDATED`, last event)``, where bit ``i`` of ``mask`` says the ``i``-th column is set
(a value may itself be ``NULL``; a column not set has ``0``, left unread) and a last event of
``0`` leaves ``last_event`` as it is."""


@functools.lru_cache(maxsize=256)
def _statement(head: str, width: int, rows: int, tail: str) -> str:
    """``head``, ``rows`` rows of ``width`` placeholders, ``tail``: the same string object
    for the same size, so the statement cache's look-up hashes it once, not every commit."""
    row = "(" + ", ".join("?" * width) + ")"
    return head + ", ".join([row] * rows) + tail


def execute_rows(
    cursor: sqlite3.Cursor, head: str, rows: Sequence[Sequence[Any]], *, tail: str = ") LIMIT ?"
) -> None:
    """``head (…), (…) … tail`` for ``rows``, ``tail`` ending in ``LIMIT ?``: in statements of
    a few sizes (powers of two, as the variable limit allows), each filled up with rows of
    zeros that the ``LIMIT`` (the number of real rows) leaves out. A commit's statement texts
    are then a handful that the connection has prepared before. (Fillers are ``0``, not
    ``None``: the sqlite3 module binds an ``int`` directly, a ``None`` after an adapter
    look-up.)"""
    if not rows:
        return
    width = len(rows[0])
    fit = (_MAX_VARIABLES - 1) // width  # rows per statement, beside the LIMIT's variable
    most = 1 << (fit.bit_length() - 1)
    for start in range(0, len(rows), most):
        chunk = rows[start : start + most]
        # The statement's size class: a power of two from _SMALLEST to ``most``.
        size = min(most, max(_SMALLEST, 1 << (len(chunk) - 1).bit_length()))
        values = [value for row in chunk for value in row]
        values.extend([0] * (width * (size - len(chunk))))
        values.append(len(chunk))
        cursor.execute(_statement(head, width, size, tail), values)


def inserted_row(row: RunRow, columns: dict[str, Any] | None, last_event: int) -> tuple[Any, ...]:
    """``row`` as a row for :data:`INSERT_HEAD`, with the changes ``columns`` queued for it
    in the same commit and its last event in the batch."""
    row = msgspec.structs.replace(
        row, **(columns or {}), last_event=max(row.last_event, last_event)
    )
    return msgspec.structs.astuple(row)


def row_updates(
    updates: dict[str, dict[str, Any]], last_event: dict[str, int], inserted: set[str]
) -> list[tuple[Any, ...]]:
    """The batch's row updates as rows for :data:`UPDATE_HEAD`, each with the run's last
    event in the batch; none for the runs in ``inserted`` (inserted with their changes). A
    run with events and no update keeps its row as it is (see :data:`LAST_EVENT`)."""
    rows = []
    for run_id, columns in updates.items():
        if run_id in inserted:
            continue
        mask = sum(1 << i for i, name in enumerate(UPDATED) if name in columns)
        values = [columns.get(name, 0) for name in UPDATED]
        rows.append((run_id, mask, *values, last_event.get(run_id, 0)))
    return rows
