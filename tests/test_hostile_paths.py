"""Hostile paths and arguments: property tests of the path guard and the call fingerprint.

The path guard is exercised through the real file tools (``read_text``, ``list_text``) on
a real tree with a sibling ``secret`` folder; whatever path hypothesis makes up, nothing
of the secret folder (its content or its entry names) is ever returned.
"""

from __future__ import annotations

import json
import os
import random
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.fingerprint import fingerprint_call
from actors.tools import ToolError, ToolLimits
from actors.tools.fs_list import list_text
from actors.tools.fs_read import read_text

SECRET_CONTENT = "TOPSECRET-7f3a91"
SECRET_NAME = "zz_hidden_entry_name"
LIMITS = ToolLimits()


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``base/root`` (the folder) beside ``base/secret``; links of every kind in the root."""
    base = tmp_path_factory.mktemp("hostile")
    root, secret = base / "root", base / "secret"
    (root / "sub" / "deep").mkdir(parents=True)
    secret.mkdir()
    (secret / f"{SECRET_NAME}.txt").write_text(SECRET_CONTENT)
    (secret / SECRET_NAME).mkdir()
    (base / "secret.txt").write_text(SECRET_CONTENT)
    (root / "a.txt").write_text("alpha\n")
    (root / "sub" / "b.txt").write_text("beta\n")
    (root / "caf\u00e9.txt").write_text("nfc\n")  # NFC name; NFD spellings must not escape
    links = {
        "out_dir": "../secret",
        "out_file": f"../secret/{SECRET_NAME}.txt",
        "out_abs": str(secret),
        "loop1": "loop2",
        "loop2": "loop1",
        "self": "self",
        "chain1": "chain2",
        "chain2": "sub",
        "chain_out1": "chain_out2",
        "chain_out2": "sub/deep/up",
        "dangling": "nowhere/at/all",
    }
    for name, target in links.items():
        (root / name).symlink_to(target)
    (root / "sub" / "deep" / "up").symlink_to("../../../secret")
    return root


SEGMENTS = [
    "..",
    ".",
    "",
    "...",
    "a.txt",
    "sub",
    "deep",
    "b.txt",
    "secret",
    "secret.txt",
    SECRET_NAME,
    f"{SECRET_NAME}.txt",
    "out_dir",
    "out_file",
    "out_abs",
    "loop1",
    "self",
    "chain1",
    "chain_out1",
    "dangling",
    "up",
    "root",
    "caf\u00e9.txt",
    unicodedata.normalize("NFD", "caf\u00e9.txt"),
    "\u2025",  # two-dot leader
    "\uff0e\uff0e",  # fullwidth dots
    "..\u2215secret",  # division slash
    "x" * 300,
    "\x00",
    "a.txt\x00.png",
    "%2e%2e",
    "~",
    "$HOME",
]
SEPARATORS = ["/", "\\", "//", "/./", "\\..\\"]


@st.composite
def hostile_paths(draw: st.DrawFn, base: str) -> str:
    parts = draw(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=8))
    seps = draw(st.lists(st.sampled_from(SEPARATORS), min_size=len(parts), max_size=len(parts)))
    path = "".join(sep + part for sep, part in zip(seps, parts, strict=True))
    prefix = draw(st.sampled_from(["", "", "/", base + "/", base + "/root/", "/etc/", "../"]))
    return prefix + path.lstrip("/\\") if draw(st.booleans()) else prefix + path


def _assert_nothing_leaks(text: str) -> None:
    assert SECRET_CONTENT not in text
    assert SECRET_NAME not in text


def _outcome(read: bool, root: Path, path: str) -> tuple[str, str | None]:
    """The text the tool returned, or its error message and kind."""
    try:
        if read:
            return read_text(root, path, 0, None, LIMITS), None
        return list_text(root, path, LIMITS), None
    except ToolError as exc:
        return exc.message, exc.kind


def _try_both(root: Path, path: str) -> None:
    for read in (True, False):
        text, kind = _outcome(read, root, path)
        _assert_nothing_leaks(text)
        assert kind in (None, "path", "binary", "too_large")


@settings(
    max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_no_generated_path_reads_or_lists_anything_outside_the_root(
    tree: Path, data: st.DataObject
) -> None:
    path = data.draw(hostile_paths(str(tree.parent)))
    _try_both(tree, path)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(path=st.text(min_size=0, max_size=300))
def test_no_arbitrary_text_as_a_path_escapes(tree: Path, path: str) -> None:
    _try_both(tree, path)


@pytest.mark.parametrize(
    "path",
    ["out_dir", "out_file", "out_abs", "chain_out1", "sub/deep/up", "loop1", "self", "dangling"],
)
def test_every_link_out_or_in_circles_is_refused(tree: Path, path: str) -> None:
    with pytest.raises(ToolError):
        read_text(tree, path, 0, None, LIMITS)
    with pytest.raises(ToolError):
        list_text(tree, path, LIMITS)


def test_the_tree_is_really_hostile(tree: Path) -> None:
    # The secret is reachable by the operating system through the links (so a guard that
    # did not resolve them would leak), and the root itself lists fine.
    assert (tree / "out_file").read_text() == SECRET_CONTENT
    assert (tree / "chain_out1" / f"{SECRET_NAME}.txt").read_text() == SECRET_CONTENT
    listing = list_text(tree, ".", LIMITS)
    assert "a.txt" in listing
    assert "out_dir  (unavailable link)" in listing
    assert read_text(tree, "chain1/b.txt", 0, None, LIMITS).strip().endswith("beta")
    assert os.path.islink(tree / "loop1")


# ---------------------------------------------------------------- fingerprints

JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer())
    | st.text(max_size=20)
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ARGUMENTS = st.dictionaries(st.text(max_size=8), JSON_VALUES, min_size=1, max_size=5)


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: _shuffled(item, rng) for key, item in items}
    if isinstance(value, list):
        return [_shuffled(item, rng) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and rng.random() < 0.3:
        return float(value) if abs(value) < 2**53 else value  # 1 and 1.0 are one argument
    return value


@settings(max_examples=300, deadline=None)
@given(arguments=ARGUMENTS, seed=st.integers(), indent=st.sampled_from([None, 0, 2]))
def test_key_order_and_equivalent_json_never_change_the_fingerprint(
    arguments: dict[str, Any], seed: int, indent: int | None
) -> None:
    rng = random.Random(seed)
    original = json.dumps(arguments)
    equivalent = json.dumps(
        _shuffled(arguments, rng), indent=indent, ensure_ascii=rng.random() < 0.5
    )
    assert fingerprint_call("t", original) == fingerprint_call("t", equivalent)


def _mutations(value: Any) -> list[Any]:
    """Values that differ from ``value`` as JSON arguments."""
    if isinstance(value, bool):
        return [not value, None]
    if isinstance(value, int):
        return [value + 1, str(value)]
    if isinstance(value, float):
        return [value + 0.5 if value + 0.5 != value else value * 2 + 1, None]
    if isinstance(value, str):
        return [value + "x", None]
    if value is None:
        return [0, ""]
    if isinstance(value, list):
        changed: list[Any] = [[*value, None]]
        changed += [
            [*value[:i], m, *value[i + 1 :]] for i, v in enumerate(value) for m in _mutations(v)[:1]
        ]
        return changed
    assert isinstance(value, dict)
    out: list[Any] = [{**value, "\u0000new": 1}]
    for key, item in value.items():
        out.append({k: v for k, v in value.items() if k != key})
        out.extend({**value, key: m} for m in _mutations(item)[:1])
    return out


@settings(max_examples=200, deadline=None)
@given(arguments=ARGUMENTS)
def test_any_change_to_any_argument_changes_the_fingerprint(arguments: dict[str, Any]) -> None:
    before = fingerprint_call("t", json.dumps(arguments))
    assert fingerprint_call("u", json.dumps(arguments)) != before  # the tool name counts too
    for changed in _mutations(arguments):
        if changed != arguments or json.dumps(changed) != json.dumps(arguments):
            assert fingerprint_call("t", json.dumps(changed)) != before, changed
