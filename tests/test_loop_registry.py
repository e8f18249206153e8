"""The loop detectors are listed once, in ``actors.loop.registry`` (issue #31).

Proved by counting: no other literal of the product code (a tuple, list, set, dict or
``Literal[...]``) names three or more detectors, and no class but ``LoopConfig`` declares
three or more of them as fields. The two places a detector's name must also appear are
checked against the registry instead: its config section (a ``LoopConfig`` field) and its
cause in the cause table (``bus.exit``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import msgspec

from actors.loop import DETECTORS, LoopConfig, LoopDetector
from actors.loop.config import LEVELLED, SECTIONS, Section, check_config
from actors.loop.presets import OFF, PRESETS
from actors.loop.registry import REGISTRY, tool_detectors
from bus import CAUSES, cause_hint

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bus", "actors", "orchestrator")
REGISTRY_FILE = ROOT / "actors" / "loop" / "registry.py"
CAUSE_TABLE = ROOT / "bus" / "causes.py"
"""The cause table: every cause once with its hint (a detector's cause among them)."""
NAMES = frozenset(DETECTORS)


def _named(node: ast.AST) -> set[str]:
    """The detector names ``node`` mentions: as a string (``"ping_pong"``,
    ``"loop.ping_pong"``), an attribute (``config.ping_pong``) or a keyword argument."""
    found: set[str] = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Constant) and isinstance(inner.value, str):
            found.add(inner.value.removeprefix("loop."))
        elif isinstance(inner, ast.Attribute):
            found.add(inner.attr)
        elif isinstance(inner, ast.keyword) and inner.arg is not None:
            found.add(inner.arg)
    return found & NAMES


def detector_lists(path: Path) -> list[str]:
    """Where ``path`` writes a list of three or more detectors (``file:line``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict):
            names = _named(node)
        elif isinstance(node, ast.ClassDef) and node.name != "LoopConfig":
            fields = [s.target for s in node.body if isinstance(s, ast.AnnAssign)]
            names = {t.id for t in fields if isinstance(t, ast.Name)} & NAMES
        else:
            continue
        if len(names) >= 3:
            found.append(f"{path.as_posix()}:{node.lineno} {sorted(names)}")
    return found


def product_files() -> list[Path]:
    skip = {REGISTRY_FILE, CAUSE_TABLE}
    return [
        path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path not in skip
    ]


def test_no_other_list_of_detectors_in_the_product_code() -> None:
    found = [where for path in product_files() for where in detector_lists(path)]
    assert found == [], "detectors listed outside actors/loop/registry.py:\n" + "\n".join(found)


def test_the_scan_finds_a_list_it_should(tmp_path: Path) -> None:
    """The scan is not vacuous: the registry itself, and the lists it replaced, are found."""
    assert detector_lists(REGISTRY_FILE)
    sample = tmp_path / "sample.py"
    sample.write_text(
        'LEVELLED = ("generic_repeat", "poll_no_progress", "ping_pong")\n'
        "def f(c):\n    return ((c.cycle.enabled, 1), (c.call_cap.enabled, 2), (c.content, 3))\n"
        'STOPS = {"generic_repeat": 1, "content": 2, "llm_check": 3}\n'
        'Detector = Literal["cycle", "content", "loop.read_loop"]\n',
        encoding="utf-8",
    )
    assert len(detector_lists(sample)) == 4


def test_every_detector_has_one_config_section() -> None:
    names = [entry.name for entry in REGISTRY]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(SECTIONS)
    for name in SECTIONS:
        assert isinstance(getattr(LoopConfig(), name), Section), name
        # the daemon's floor may lower only fields the section has
        kind = type(getattr(LoopConfig(), name))
        assert kind.stops <= set(kind.__struct_fields__), name


def test_every_detector_name_has_a_cause_with_a_hint() -> None:
    for name in DETECTORS:
        assert f"loop.{name}" in CAUSES, name
        assert cause_hint(f"loop.{name}"), name


def test_the_tool_detectors_built_are_the_enabled_ones() -> None:
    everything = LoopConfig(
        **{
            name: msgspec.structs.replace(getattr(LoopConfig(), name), enabled=True)
            for name in SECTIONS
        }
    )
    built = tool_detectors(check_config(everything))
    expected = [entry.name for entry in REGISTRY if entry.build is not None]
    assert len(built) == len(expected) == 12
    assert tool_detectors(OFF) == ()
    # a detector switched off is not built: each preset builds exactly its enabled ones
    for preset in PRESETS.values():
        enabled = [e for e in REGISTRY if e.build and getattr(preset, e.name).enabled]
        assert len(LoopDetector(preset)._plan.detectors) == len(enabled), preset.name


def test_the_derived_lists() -> None:
    assert OFF.name == "off"
    assert not any(getattr(OFF, name).enabled for name in SECTIONS)
    assert set(LEVELLED) == {
        name for name in SECTIONS if "warn_at" in type(getattr(OFF, name)).__struct_fields__
    }


def test_every_finding_is_named_after_a_registered_detector() -> None:
    """What the ``Detector`` Literal checked: each ``Hit("name", ...)`` and
    ``detector="name"`` of the loop package names a registered detector."""
    named = []
    for path in sorted((ROOT / "actors" / "loop").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id == "Hit" and node.args:
                named.append((path.name, node.args[0]))
            named += [(path.name, kw.value) for kw in node.keywords if kw.arg == "detector"]
    constants = [(f, n.value) for f, n in named if isinstance(n, ast.Constant)]
    assert len(constants) >= len(DETECTORS)
    assert [(f, v) for f, v in constants if v not in NAMES] == []
