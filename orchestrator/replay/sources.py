"""Where recordings come from: a daemon store, JSONL event logs, OpenAI chat transcripts.

* a **SQLite store** (``*.db``/``*.sqlite``/``*.sqlite3``, the daemon's ``store.path``):
  every ended run, its events read back through :class:`bus.LogReader`, its request's
  ``config`` (and a shipped scenario's own table) as the run's overrides;
* a **JSONL** file (``*.jsonl``): one run's events, one logged message a line, as
  ``loopfuse watch ID --json`` prints them;
* a **JSON** file (``*.json``): a loopfuse **run export**, ``{"name": ..., "config":
  {...}, "events": [...]}`` (the run's logged events, and its settings as run overrides:
  the corpus ``python -m bench.waste --real --record DIR`` writes), or an OpenAI
  chat-format transcript, ``{"messages": [...], "tools": [...]}`` or a bare list of
  messages (:mod:`orchestrator.replay.openai_chat`);
* a **directory**: each such file in it, sorted by name.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import msgspec

from bus import DECODER, BusMessage, LogReader, Message
from orchestrator.replay.openai_chat import recording_from_chat
from orchestrator.replay.recording import Recording, RecordingError, recording_from_events

__all__ = ["MAX_INPUT_BYTES", "load_recordings", "recording_from_export", "recording_from_jsonl"]

MAX_INPUT_BYTES: Final = 256 * 1024 * 1024
"""A file larger than this is refused (a replay holds a run in memory)."""

_STORE_SUFFIXES: Final = (".db", ".sqlite", ".sqlite3")
_JSON: Final = msgspec.json.Decoder()


def load_recordings(paths: list[str]) -> list[Recording]:
    """Every recording ``paths`` hold, in order.

    :raises RecordingError: a path is missing, unreadable, or holds no replayable run.
    """
    found: list[Recording] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files = sorted(
                p for p in path.iterdir() if p.suffix in (*_STORE_SUFFIXES, ".jsonl", ".json")
            )
            if not files:
                raise RecordingError(f"{raw}: no .jsonl, .json or store file in the directory")
            for file in files:
                found.extend(_load_file(file))
        elif path.is_file():
            found.extend(_load_file(path))
        else:
            raise RecordingError(f"{raw}: no such file or directory")
    return found


def _load_file(path: Path) -> list[Recording]:
    try:  # a directory's entry may be a dangling link, or gone since it was listed
        if path.stat().st_size > MAX_INPUT_BYTES:
            raise RecordingError(f"{path}: larger than {MAX_INPUT_BYTES} bytes")
        if path.suffix in _STORE_SUFFIXES:
            return list(_from_store(path))
        data = path.read_bytes()
    except OSError as exc:
        raise RecordingError(f"{path}: {exc.strerror or exc}") from None
    if path.suffix == ".jsonl":
        return [recording_from_jsonl(path.name, data)]
    try:
        document = _JSON.decode(data)
    except msgspec.DecodeError as exc:
        raise RecordingError(f"{path}: not JSON: {exc}") from None
    if isinstance(document, dict) and "events" in document:
        return [recording_from_export(path.name, document)]
    return [recording_from_chat(path.name, document)]


def recording_from_export(name: str, document: dict[str, Any], *, config: bool = True) -> Recording:
    """A run export, ``{"name": ..., "config": {...}, "events": [...]}``: its logged events
    (as ``GET /v1/runs/{id}/events`` streams them) and, with ``config`` (trusted input
    only), its ``config`` as the run's overrides. Its ``name`` names it (else ``name``).

    :raises RecordingError: ``events`` is not a list of run events, ``config`` not an object
        (or given where ``config`` is false).
    """
    label = document.get("name") if isinstance(document.get("name"), str) else name
    events, overrides = document.get("events"), document.get("config", {})
    if not isinstance(events, list):
        raise RecordingError(f"{name}: events: a list is required")
    if "config" in document and not config:
        raise RecordingError(f"{name}: config: not accepted here (runs replay under the config)")
    if not isinstance(overrides, dict):
        raise RecordingError(f"{name}: config: an object of run settings is required")
    reader = LogReader()
    messages: list[Message] = []
    for index, event in enumerate(events):
        try:
            messages.append(reader.read(msgspec.convert(event, BusMessage)))
        except (msgspec.ValidationError, ValueError) as exc:
            raise RecordingError(f"{name}: events[{index}]: not a run event: {exc}") from None
    return recording_from_events(str(label), messages, overrides=overrides)


def recording_from_jsonl(name: str, data: bytes) -> Recording:
    """A run from its logged events, one JSON message a line."""
    reader = LogReader()
    events: list[Message] = []
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            events.append(reader.read(DECODER.decode(line)))
        except (msgspec.DecodeError, ValueError) as exc:
            raise RecordingError(f"{name}: line {number}: not a run event: {exc}") from None
    return recording_from_events(name, events)


def _from_store(path: Path) -> Iterator[Recording]:
    from orchestrator.sim import shipped_scenarios

    scenarios = {s.name: s for s in shipped_scenarios()}
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise RecordingError(f"{path}: cannot open the store: {exc}") from None
    try:
        runs = conn.execute(
            "SELECT cursor, id, request FROM runs WHERE status = 'ended' ORDER BY cursor"
        ).fetchall()
        for cursor, run_id, request in runs:
            rows = conn.execute(
                "SELECT data FROM run_events WHERE run = ? ORDER BY seq", (cursor,)
            ).fetchall()
            reader = LogReader()
            try:
                events = [reader.read(DECODER.decode(data)) for (data,) in rows]
            except (msgspec.DecodeError, ValueError) as exc:
                raise RecordingError(f"{path}: run {run_id}: {exc}") from None
            yield recording_from_events(run_id, events, overrides=_overrides(request, scenarios))
    except sqlite3.Error as exc:
        raise RecordingError(f"{path}: not a loopfuse store: {exc}") from None
    finally:
        conn.close()


def _overrides(request: bytes, scenarios: dict[str, Any]) -> dict[str, Any]:
    try:
        stored = _JSON.decode(request)
    except msgspec.DecodeError:
        return {}
    if not isinstance(stored, dict):
        return {}
    scenario = scenarios.get(stored.get("scenario") or "")
    config = stored.get("config")
    return {**(scenario.config if scenario else {}), **(config if isinstance(config, dict) else {})}
