"""The built-in tools: read_file, list_dir, finish_exploration."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from actors.tools import (
    PATH_ERROR,
    READ_CHARS,
    ToolContext,
    ToolError,
    ToolLimits,
    default_registry,
    invoke,
)
from actors.tools.finish import KEY_FINDINGS_MAX
from actors.tools.fs_list import list_text
from actors.tools.fs_read import read_text

LIMITS = ToolLimits()
NEXT_OFFSET = re.compile(r"offset=(\d+)")


def _read(root: Path, path: str, offset: int = 0, limit: int | None = None) -> str:
    return read_text(root, path, offset, limit, LIMITS)


def _body_and_note(text: str) -> tuple[str, str]:
    body, _, note = text.rpartition("\n[read_file:")
    return body + "\n", "[read_file:" + note


# ---------------------------------------------------------------------------- read_file


def test_small_file_is_read_whole(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one\ntwo\nthree")
    assert _read(tmp_path, "a.txt") == "one\ntwo\nthree"


def test_offset_and_limit_count_lines(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("".join(f"line {i}\n" for i in range(10)))
    text = _read(tmp_path, "a.txt", offset=3, limit=2)
    assert text.startswith("line 3\nline 4\n")
    assert "offset=5" in text
    assert _read(tmp_path, "a.txt", offset=8) == "line 8\nline 9\n"
    assert "past the end" in _read(tmp_path, "a.txt", offset=50)
    assert "end of the file" in _read(tmp_path, "a.txt", offset=10)


def test_long_file_is_cut_at_7000_characters_and_continues_exactly(tmp_path: Path) -> None:
    lines = [f"{i:05d} " + "x" * 93 + "\n" for i in range(300)]  # 100 chars a line
    (tmp_path / "big.txt").write_text("".join(lines))

    first = _read(tmp_path, "big.txt")
    body, note = _body_and_note(first)
    assert len(body) <= READ_CHARS
    assert body == "".join(lines[:70])
    assert "cut at 7000 characters" in note
    assert "offset=70" in note
    assert "limit" in note

    seen: list[str] = []
    offset = 0
    while True:
        text = _read(tmp_path, "big.txt", offset=offset)
        match = NEXT_OFFSET.search(text.rpartition("[read_file:")[2])
        if match is None:
            seen.append(text)
            break
        body, _ = _body_and_note(text)
        seen.append(body)
        offset = int(match.group(1))
    assert "".join(seen) == "".join(lines)  # nothing skipped, nothing repeated


def test_continuing_with_offset_and_limit(tmp_path: Path) -> None:
    lines = [f"{i:04d}" + "y" * 195 + "\n" for i in range(100)]  # 200 chars a line
    (tmp_path / "b.txt").write_text("".join(lines))
    note = _body_and_note(_read(tmp_path, "b.txt"))[1]
    next_offset = int(NEXT_OFFSET.search(note).group(1))  # type: ignore[union-attr]
    assert next_offset == 35
    text = _read(tmp_path, "b.txt", offset=next_offset, limit=5)
    body, note = _body_and_note(text)
    assert body == "".join(lines[35:40])
    assert "offset=40" in note


def test_a_single_line_longer_than_the_budget_is_cut_and_skipped(tmp_path: Path) -> None:
    (tmp_path / "wide.csv").write_text("head\n" + "z" * 20_000 + "\ntail\n")
    first = _read(tmp_path, "wide.csv")
    assert first.startswith("head\n")
    assert "offset=1" in first
    long = _read(tmp_path, "wide.csv", offset=1)
    assert long.startswith("z" * READ_CHARS)
    assert "z" * (READ_CHARS + 1) not in long
    assert "offset=2" in long
    assert _read(tmp_path, "wide.csv", offset=2) == "tail\n"


def test_binary_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(100))
    with pytest.raises(ToolError) as info:
        _read(tmp_path, "img.png")
    assert info.value.kind == "binary"
    assert "binary" in info.value.message


def test_non_utf8_is_decoded_with_replacement(tmp_path: Path) -> None:
    (tmp_path / "latin.txt").write_bytes("café\n".encode("latin-1"))
    assert _read(tmp_path, "latin.txt") == "caf\ufffd\n"


def test_empty_file_and_directory(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "sub").mkdir()
    assert "empty" in _read(tmp_path, "empty.txt")
    with pytest.raises(ToolError, match="directory"):
        _read(tmp_path, "sub")


def test_read_outside_gets_the_path_error(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    for path in ("../x", "/etc/passwd", "missing.txt"):
        with pytest.raises(ToolError) as info:
            _read(root, path)
        assert info.value.message == PATH_ERROR


def test_a_huge_offset_stops_at_the_scan_cap(tmp_path: Path) -> None:
    (tmp_path / "many.txt").write_text("x\n" * 5000)
    limits = ToolLimits(max_scan_bytes=1000)
    with pytest.raises(ToolError) as info:
        read_text(tmp_path, "many.txt", 4000, None, limits)
    assert info.value.kind == "too_large"
    assert read_text(tmp_path, "many.txt", 10, 2, limits) == "x\nx\n" + (
        "[read_file: 2 lines shown; the file continues at offset=12.]"
    )


def _bytes_read_by_this_thread() -> int:
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/thread-self/io")


def _one_line_sparse_file(root: Path) -> Path:
    # 4 GiB of one line: text, then a hole (NUL bytes past the binary probe, no newline).
    path = root / "one-line.txt"
    path.write_bytes(b"a" * 10_000)
    os.truncate(path, 4 << 30)
    return path


def test_a_multi_gib_line_is_cut_without_reading_it(tmp_path: Path) -> None:
    _one_line_sparse_file(tmp_path)
    before = _bytes_read_by_this_thread()
    text = _read(tmp_path, "one-line.txt")
    read = _bytes_read_by_this_thread() - before
    assert text.startswith("a" * 7000)
    assert "the line at offset 0 is longer than 7000 characters" in text
    assert read < 1 << 20  # the head of the line, not the rest of its 4 GiB


def test_skipping_a_multi_gib_line_stops_at_the_byte_cap(tmp_path: Path) -> None:
    _one_line_sparse_file(tmp_path)
    limits = ToolLimits(max_scan_bytes=8 << 20)
    before = _bytes_read_by_this_thread()
    with pytest.raises(ToolError) as info:
        read_text(tmp_path, "one-line.txt", 1, None, limits)
    read = _bytes_read_by_this_thread() - before
    assert info.value.kind == "too_large"
    assert f"stopped reading after {8 << 20} bytes" in info.value.message
    assert read <= (8 << 20) + (1 << 20)


def test_reading_stops_at_the_time_bound(tmp_path: Path) -> None:
    _one_line_sparse_file(tmp_path)
    limits = ToolLimits(max_scan_seconds=1e-9)  # over before the first line is asked for
    with pytest.raises(ToolError) as info:
        read_text(tmp_path, "one-line.txt", 1, None, limits)
    assert info.value.kind == "too_large"
    assert "stopped reading after 1e-09 s" in info.value.message


# ---------------------------------------------------------------------------- list_dir


def test_list_dir_sorted_with_dirs_marked_and_sizes(tmp_path: Path) -> None:
    (tmp_path / "b.csv").write_text("12345")
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "c.txt").write_text("")
    (tmp_path / "link_in").symlink_to("b.csv")
    (tmp_path / "link_out").symlink_to("/etc")
    assert list_text(tmp_path, ".", LIMITS).splitlines() == [
        "a_dir/",
        "b.csv  (5 bytes)",
        "c.txt  (0 bytes)",
        "link_in  (5 bytes)",
        "link_out  (unavailable link)",
    ]


def test_list_dir_is_bounded_with_a_note(tmp_path: Path) -> None:
    for i in range(12):
        (tmp_path / f"f{i:02d}").write_text("")
    lines = list_text(tmp_path, ".", ToolLimits(list_entries=5)).splitlines()
    assert lines[:5] == [f"f{i:02d}  (0 bytes)" for i in range(5)]
    assert "7 more entries not shown (12 in all)" in lines[5]


def test_list_dir_reads_a_huge_directory_only_up_to_its_bound(tmp_path: Path) -> None:
    for i in range(30):
        (tmp_path / f"f{i:02d}").write_text("")
    lines = list_text(tmp_path, ".", ToolLimits(list_entries=5, list_scan_entries=12))
    assert len(lines.splitlines()) == 6
    shown = [line.split()[0] for line in lines.splitlines()[:5]]
    assert shown == sorted(shown)
    assert lines.splitlines()[5] == (
        "[list_dir: the directory holds more than 12 entries; 5 of the first 12 read (in "
        "the directory's own order) are shown, by name. List a subdirectory or read a file "
        "by name.]"
    )


def test_list_dir_errors(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(ToolError, match="not a directory"):
        list_text(tmp_path, "f.txt", LIMITS)
    with pytest.raises(ToolError, match=PATH_ERROR):
        list_text(tmp_path, "..", LIMITS)
    (tmp_path / "e").mkdir()
    assert list_text(tmp_path, "e", LIMITS) == "[list_dir: the directory is empty.]"


# ---------------------------------------------------------------------------- through invoke


async def _call(root: Path | None, name: str, arguments: str) -> tuple[str, str | None]:
    tool = default_registry().get(name)
    assert tool is not None
    outcome = await invoke(tool, arguments, ToolContext("r1", root), max_chars=100_000)
    return outcome.content, outcome.error_kind


@pytest.mark.asyncio
async def test_tools_answer_errors_as_results(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello\n")
    assert await _call(tmp_path, "read_file", '{"path": "a.txt"}') == ("hello\n", None)
    assert await _call(tmp_path, "read_file", '{"path": "../x"}') == (PATH_ERROR, "path")
    assert (await _call(tmp_path, "list_dir", ""))[0] == "a.txt  (6 bytes)"
    content, kind = await _call(None, "list_dir", "{}")
    assert kind == "path"
    assert "no folder" in content
    content, kind = await _call(tmp_path, "read_file", '{"path": "a.txt", "limit": 0}')
    assert kind == "invalid_arguments"
    assert "$.limit" in content


@pytest.mark.asyncio
async def test_finish_exploration_acknowledges(tmp_path: Path) -> None:
    args = '{"experiment": "S21 sweep", "goal": "find the band gap", "key_findings": ["a", "b"]}'
    content, kind = await _call(tmp_path, "finish_exploration", args)
    assert kind is None
    assert "S21 sweep" in content
    assert "2 key findings" in content
    registry = default_registry()
    finish = registry.get("finish_exploration")
    assert finish is not None
    assert finish.finishes_stage
    assert not any(t.finishes_stage for t in registry if t.name != "finish_exploration")


@pytest.mark.asyncio
async def test_finish_exploration_offers_a_bounded_findings_list() -> None:
    # The bound is in the schema the model is offered (a server that generates arguments
    # under it stops the list there) and the check agrees with it at the edge.
    finish = default_registry().get("finish_exploration")
    assert finish is not None
    findings = json.loads(finish.spec.parameters)["properties"]["key_findings"]
    assert findings["maxItems"] == KEY_FINDINGS_MAX == 20
    args = {"experiment": "e", "goal": "g", "key_findings": [f"f{n}" for n in range(20)]}
    content, kind = await _call(None, "finish_exploration", json.dumps(args))
    assert kind is None
    assert "20 key findings" in content


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"experiment": "e", "goal": "g"}', "missing required field `key_findings`"),
        ('{"experiment": "e", "goal": "g", "key_findings": []}', "$.key_findings"),
        ('{"experiment": "e", "goal": "g", "key_findings": "x"}', "$.key_findings"),
        (
            '{"experiment": "e", "goal": "g", "key_findings": ' + json.dumps(["x"] * 21) + "}",
            "length <= 20 - at `$.key_findings`",
        ),
        ('{"experiment": "e", "goal": "g", "key_findings": ["x"], "z": 1}', "unknown field `z`"),
        ('{"experiment": "e", ', "not valid JSON"),
    ],
)
async def test_finish_exploration_validation(arguments: str, expected: str) -> None:
    content, kind = await _call(None, "finish_exploration", arguments)
    assert kind == "invalid_arguments"
    assert expected in content
    assert "finish_exploration" in content
