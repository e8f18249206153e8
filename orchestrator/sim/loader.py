"""Load and validate scenario files; find the shipped ones.

Every problem raises :class:`ScenarioError`, whose message names the file, the key path
and the reason: ``scenarios/x.toml: steps[2].tool_calls[0].arguments: expected a table``.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Final, get_args

import msgspec

from bus import ExitReason
from orchestrator.errors import ScenarioError
from orchestrator.sim.checks import check_scenario
from orchestrator.sim.scenario import (
    ArgumentStream,
    CallVerdict,
    ErrorShape,
    FaultKind,
    FinishReason,
    Scenario,
    ServerProfile,
    Step,
)

__all__ = [
    "SCENARIO_DIR",
    "ScenarioError",
    "find_scenario",
    "load_scenario",
    "load_scenarios",
    "optional_scenarios",
    "parse_scenario",
    "shipped_scenarios",
]

SCENARIO_DIR: Final = Path(__file__).resolve().parent.parent / "scenarios"
OPTIONAL_SCENARIO_DIRS: Final = (SCENARIO_DIR / "mcp",)
"""Shipped scenarios that need an extra and an operator's config (``mcp_git``: the mcp
extra and a git server, docs/mcp.md): found by name like the others, but not among
:func:`shipped_scenarios`, so ``loopfuse demo`` and the daemon's list are the same with or
without the extra."""


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    """Read, decode and validate the scenario file at ``path``; its name defaults to the stem."""
    file = Path(path)
    try:  # ``scenarios/x.toml`` for shipped files, the path as given otherwise
        source = str(file.resolve().relative_to(SCENARIO_DIR.parent))
    except ValueError:
        source = str(file)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(source, "", f"cannot read: {exc.strerror or exc}") from None
    return parse_scenario(text, source=source, name=file.stem)


def parse_scenario(text: str, *, source: str, name: str) -> Scenario:
    """Decode and validate TOML ``text``; ``source`` names it in errors, ``name`` is the default."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(source, "", f"invalid TOML: {exc}") from None
    raw.setdefault("name", name)
    runs = raw.get("runs")
    if "expect" not in raw and isinstance(runs, list) and runs:  # every run has its own
        for i, run in enumerate(runs):
            if isinstance(run, dict) and "expect" not in run:
                raise ScenarioError(source, f"runs[{i}].expect", "missing (the file has none)")
        if isinstance(runs[0], dict):
            raw["expect"] = runs[0]["expect"]
    tracks: dict[str, tuple[Step, ...]] = {}
    raw_tracks = raw.pop("tracks", {})
    if not isinstance(raw_tracks, dict):
        raise ScenarioError(source, "tracks", "expected a table of step arrays")
    for track, steps in raw_tracks.items():
        try:
            tracks[track] = msgspec.convert(steps, tuple[Step, ...])
        except msgspec.ValidationError as exc:
            path, reason = _translate(str(exc))
            path = f"tracks.{track}{'' if path.startswith('[') or not path else '.'}{path}"
            raise ScenarioError(source, path, reason) from None
    folder = raw.pop("folder", {})
    if not isinstance(folder, dict):
        raise ScenarioError(source, "folder", "expected a table of path = text")
    for key, value in folder.items():
        if not isinstance(value, str):
            got = _NOUNS.get(type(value).__name__, type(value).__name__)
            raise ScenarioError(source, f"folder.{key!r}", f"expected a string, got {got}")
    try:
        scenario = msgspec.convert(raw, Scenario)
    except msgspec.ValidationError as exc:
        path, reason = _translate(str(exc))
        raise ScenarioError(source, path, reason) from None
    scenario = msgspec.structs.replace(scenario, tracks=tracks, folder=folder)
    for path, reason in check_scenario(scenario):
        raise ScenarioError(source, path, reason)
    return scenario


def load_scenarios(path: str | os.PathLike[str]) -> tuple[Scenario, ...]:
    """The scenarios of the file at ``path``: one per ``[[runs]]`` entry, else the one."""
    return load_scenario(path).expand()


def shipped_scenarios() -> tuple[Scenario, ...]:
    """Every scenario shipped in ``orchestrator/scenarios`` (a file with ``[[runs]]`` gives
    one per run, ``NAME.LABEL``), sorted by file name."""
    return _scenarios_in(SCENARIO_DIR)


def optional_scenarios() -> tuple[Scenario, ...]:
    """The shipped scenarios that need an extra (:data:`OPTIONAL_SCENARIO_DIRS`)."""
    return _scenarios_in(*OPTIONAL_SCENARIO_DIRS)


def _scenarios_in(*folders: Path) -> tuple[Scenario, ...]:
    return tuple(s for d in folders for p in sorted(d.glob("*.toml")) for s in load_scenarios(p))


def find_scenario(name_or_path: str | os.PathLike[str]) -> Scenario:
    """Load a scenario file, or the shipped scenario of that name (an optional one too:
    ``mcp_git``)."""
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or candidate.exists():
        return _single(load_scenario(candidate))
    folders = (SCENARIO_DIR, *OPTIONAL_SCENARIO_DIRS)
    name = candidate.name
    if str(name_or_path) == name:
        for folder in folders:
            if (folder / f"{name}.toml").exists():
                return _single(load_scenario(folder / f"{name}.toml"))
        shipped = SCENARIO_DIR / f"{name.rpartition('.')[0]}.toml"  # NAME.LABEL: one run
        if shipped.exists():
            for scenario in load_scenarios(shipped):
                if scenario.name == name:
                    return scenario
    names = ", ".join(sorted(p.stem for folder in folders for p in folder.glob("*.toml")))
    raise ScenarioError(str(name_or_path), "", f"no such file or shipped scenario ({names})")


def _single(scenario: Scenario) -> Scenario:
    """``scenario``, unless it stands for several runs: then name them."""
    if scenario.runs:
        names = ", ".join(s.name for s in scenario.expand())
        raise ScenarioError(scenario.name, "runs", f"has several runs; name one of: {names}")
    return scenario


_MESSAGE = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_EXPECTED = re.compile(r"^Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`")
_FIELD = re.compile(r"^Object (?P<how>missing required|contains unknown) field `(?P<key>[^`]+)`")
_ENUM = re.compile(r"^Invalid enum value (?P<value>.+)$")
_NOUNS: Final = {
    "object": "a table",
    "array": "an array",
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "null": "nothing",
    "dict": "a table",  # the Python types of TOML values
    "list": "an array",
}
_CHOICES: Final[dict[str, tuple[str, ...]]] = {
    "exit_reason": tuple(ExitReason),
    "finish_reason": get_args(FinishReason),
    "kind": get_args(FaultKind),
    "shape": get_args(ErrorShape),
    "context_error": get_args(ErrorShape),
    "server": get_args(ServerProfile),
    "arguments": get_args(ArgumentStream),
    "verdict": get_args(CallVerdict),
}


def _translate(message: str) -> tuple[str, str]:
    """Turn a msgspec validation message into ``(key path, reason)``."""
    parts = _MESSAGE.match(message)
    assert parts is not None
    what, path = parts["what"], (parts["path"] or "").removeprefix(".")
    if expected := _EXPECTED.match(what):
        want = " or ".join(_NOUNS.get(w, w) for w in expected["want"].split(" | "))
        return path, f"expected {want}, got {_NOUNS.get(expected['got'], expected['got'])}"
    if field := _FIELD.match(what):
        path = f"{path}.{field['key']}" if path else field["key"]
        return path, "missing required key" if field["how"] == "missing required" else "unknown key"
    if enum := _ENUM.match(what):
        choices = _CHOICES.get(path.rsplit(".", 1)[-1])  # by the path's last key
        tail = f"; expected one of {', '.join(choices)}" if choices else ""
        return path, f"invalid value {enum['value']}{tail}"
    return path, what
