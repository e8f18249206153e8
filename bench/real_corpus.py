"""The real-model replay corpus: each real run written as a run export ``loopfuse replay``
reads (``bench/real_corpus/``).

``python -m bench.waste --real --record DIR`` plays :data:`bench.real_model.REAL_TASKS`
under the default fuses and with them off (as ``--real`` does) and writes each run to
``DIR/<task>.<configuration>.json``:

```json
{"name": "count_lines.default", "config": {...the run's settings...}, "events": [...]}
```

``events`` are the run's logged events (as the event log stores them and ``GET
/v1/runs/{id}/events`` streams them, one a line); ``config`` the settings the real run had
that the replay cannot know from its events (the window, the turn budget, the loop preset,
the result cache), as run overrides (:class:`orchestrator.config.RunSettings` keys). A
replay of a file under its own config reproduces the recorded verdicts call by call
(``tests/test_replay_corpus.py``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from bench.real_model import DEFAULT, N_CTX, OFF, RealRun, real_config
from bus import ENCODER, for_the_log
from orchestrator.config import run_settings

__all__ = ["CORPUS", "replay_overrides", "write_corpus"]

CORPUS: Final = Path(__file__).resolve().parent / "real_corpus"
"""The committed corpus; regenerate it with
``python -m bench.waste --real --record bench/real_corpus``."""

_KEPT: Final = (
    "max_turns",
    "max_tool_calls",
    "deadline_seconds",
    "loop_preset",
    "cache_max_entries",
    "max_cache_hits",
)


def replay_overrides(preset: str) -> dict[str, Any]:
    """The run overrides that make a replay's config the real run's (``preset``:
    :data:`~bench.real_model.DEFAULT` or :data:`~bench.real_model.OFF`)."""
    config = real_config("http://127.0.0.1:1/v1", "smollm2", None if preset == DEFAULT else preset)
    settings = msgspec.to_builtins(run_settings(config))
    overrides = {key: settings[key] for key in _KEPT}
    overrides["context_window"] = N_CTX
    return overrides


def write_corpus(runs: Sequence[RealRun], directory: Path) -> list[Path]:
    """Write each of ``runs`` to ``directory`` as ``<task>.<configuration>.json``; the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for run in runs:
        if run.preset not in (DEFAULT, OFF):
            continue
        name = f"{run.task.name}.{run.preset}"
        events = [ENCODER.encode(for_the_log(msg)).decode() for msg in run.events]
        head = json.dumps({"name": name, "config": replay_overrides(run.preset)}, sort_keys=True)
        text = head[:-1] + ', "events": [\n' + ",\n".join(events) + "\n]}\n"
        path = directory / f"{name}.json"
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
