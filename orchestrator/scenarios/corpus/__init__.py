"""The fuse acceptance corpus (issue #32): legitimate runs (``legit/*.toml``) and stuck runs
(``stuck/*.toml``), played under every loop preset; the bar each must meet is in
``docs/loop-detection.md`` ("The acceptance corpus"). A file's first line names its kind
(``# kind: legit.poll``). :func:`corpus` loads them; ``bench/corpus_play.py`` plays them
(``tests/test_fuse_corpus.py``, ``python -m bench.waste --corpus``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal, get_args

import msgspec

from orchestrator.sim import Scenario, load_scenario

__all__ = ["CORPUS_DIR", "CorpusRun", "Half", "corpus"]

CORPUS_DIR: Final = Path(__file__).resolve().parent

Half = Literal["legit", "stuck"]


class CorpusRun(msgspec.Struct, frozen=True, kw_only=True):
    """One corpus scenario: its half (``legit`` / ``stuck``) and its kind (``stuck.poll``)."""

    half: Half
    kind: str
    scenario: Scenario


def corpus() -> tuple[CorpusRun, ...]:
    """The corpus scenarios: legitimate first, then stuck, each half sorted by name."""
    runs: list[CorpusRun] = []
    for h in get_args(Half):
        for path in sorted((CORPUS_DIR / h).glob("*.toml")):
            with path.open(encoding="utf-8") as file:
                first = file.readline()  # the kind it declares: ``# kind: legit.poll``
            if not first.startswith("# kind: "):
                raise ValueError(f"{path}: the first line must be '# kind: <half>.<kind>'")
            kind = first.removeprefix("# kind: ").strip()
            if not kind.startswith(f"{h}."):
                raise ValueError(f"{path}: kind {kind!r} is not of the {h} half")
            runs.append(CorpusRun(half=h, kind=kind, scenario=load_scenario(path)))
    return tuple(runs)
