"""``loopfuse replay PATH... [--preset NAME]... [--beyond repeat|end] [--json|--markdown]``.

Replays every run the paths hold (:mod:`orchestrator.replay.sources`) under the config
(``--config``, the run's own overrides over it) and under each ``--preset`` (the loop
preset replaced); prints a Markdown table (default) or one JSON document with ``rows``
and ``totals``. Exit status: 0 done, 2 bad input (one line on stderr, nothing replayed).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, get_args

import msgspec

from orchestrator.config import Config, LoopPreset
from orchestrator.replay.player import Beyond, play
from orchestrator.replay.recording import Recording, RecordingError
from orchestrator.replay.report import ReplayRow, compare, markdown, totals
from orchestrator.replay.sources import load_recordings

__all__ = ["add_replay_command", "replay_command", "replay_rows"]


def add_replay_command(commands: Any) -> None:
    """Register ``replay`` on the CLI's subcommands."""
    replay = commands.add_parser(
        "replay",
        help="what another config would have done with recorded runs (no model, no tool)",
        description=(
            "Replay every run the paths hold under the config (--config, the run's own"
            " overrides over it) and under each --preset (the loop preset replaced), calling"
            " no model and no tool. Prints a Markdown table (default) or one JSON document"
            " with rows and totals. Exit status: 0 done, 2 bad input (one line on stderr)."
        ),
    )
    replay.add_argument("paths", nargs="+", metavar="PATH", help="store, .jsonl, .json or dir")
    replay.add_argument(
        "--config",
        default=argparse.SUPPRESS,  # else it would hide a ``loopfuse --config FILE replay``
        help="TOML config file to replay under (default: $LOOPFUSE_CONFIG)",
    )
    replay.add_argument(
        "--preset",
        action="append",
        default=[],
        choices=get_args(LoopPreset),
        help="replay under this loop preset too (repeatable; default: the config's own)",
    )
    replay.add_argument(
        "--beyond",
        choices=("repeat", "end"),
        default="repeat",
        help="past the recording: repeat the model's last answer (default) or end the run",
    )
    shape = replay.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="rows and totals as one JSON document")
    shape.add_argument("--markdown", action="store_true", help="Markdown tables (the default)")


async def replay_rows(
    config: Config, recordings: list[Recording], presets: list[str], beyond: Beyond = "repeat"
) -> list[ReplayRow]:
    """Every recording under the config (label ``own``) or under each preset."""
    rows: list[ReplayRow] = []
    for recording in recordings:
        for preset in (*presets,) or (None,):
            overrides = {"loop_preset": preset} if preset else {}
            played = await play(config, recording, overrides=overrides, beyond=beyond)
            rows.append(compare(recording, played, preset or "own"))
    return rows


async def replay_command(config: Config, args: argparse.Namespace) -> int:
    """Run ``loopfuse replay``; 2 (one line on stderr) on input that is not a run."""
    try:
        recordings = load_recordings(args.paths)
    except RecordingError as exc:
        print(f"loopfuse replay: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    rows = await replay_rows(config, recordings, args.preset, args.beyond)
    if args.json:
        document = {"rows": rows, "totals": totals(rows)}
        sys.stdout.write(msgspec.json.encode(document).decode() + "\n")
    else:
        sys.stdout.write(markdown(rows))
    return 0
