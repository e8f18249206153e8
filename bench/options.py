"""Command-line options the replay benchmarks share (``bench.recorder``, ``bench.gatekeeper``,
``bench.observers``): how many runs to capture, and how often to replay them."""

from __future__ import annotations

import argparse

__all__ = ["positive", "replay_parser"]


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return number


def replay_parser(prog: str, description: str | None, *, repeat: int) -> argparse.ArgumentParser:
    """A parser with ``--runs``, ``--turns`` (the workload captured), ``--repeat`` (passes
    over it per repetition), ``--reps`` and ``--json``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--runs", type=positive, default=20, help="runs captured (default 20)")
    parser.add_argument("--turns", type=positive, default=20, help="turns per run (default 20)")
    parser.add_argument(
        "--repeat", type=positive, default=repeat, help=f"passes per rep (default {repeat})"
    )
    parser.add_argument("--reps", type=positive, default=5, help="timed repetitions (default 5)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    return parser
