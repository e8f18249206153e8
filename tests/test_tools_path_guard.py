"""The path guard: every way out of the folder gets the same answer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from actors.tools import PATH_ERROR, ToolError, guard_path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "folder"
    (folder / "data" / "run1").mkdir(parents=True)
    (folder / "data" / "run1" / "band.csv").write_text("f,s21\n1,0.5\n")
    (tmp_path / "secret.txt").write_text("outside")
    return folder


def _rejected(root: Path, path: str) -> None:
    with pytest.raises(ToolError) as info:
        guard_path(root, path)
    assert info.value.kind == "path"
    assert info.value.message == PATH_ERROR


def test_a_nested_file_resolves(root: Path) -> None:
    assert guard_path(root, "data/run1/band.csv") == (root / "data/run1/band.csv").resolve()


@pytest.mark.parametrize("path", [".", "", "data/..", "./data/../."])
def test_the_root_itself_is_allowed(root: Path, path: str) -> None:
    assert guard_path(root, path) == root.resolve()


def test_an_absolute_path_inside_the_root_is_allowed(root: Path) -> None:
    target = root / "data" / "run1" / "band.csv"
    assert guard_path(root, str(target)) == target.resolve()


@pytest.mark.parametrize(
    "path", ["..", "../secret.txt", "../../etc/passwd", "data/../../secret.txt", "/etc/passwd"]
)
def test_paths_outside_are_rejected(root: Path, path: str) -> None:
    _rejected(root, path)


def test_missing_path_inside_gets_the_same_message(root: Path) -> None:
    _rejected(root, "data/nope.csv")


def test_missing_path_inside_is_accepted_when_it_need_not_exist(root: Path) -> None:
    assert guard_path(root, "data/new.csv", must_exist=False) == root.resolve() / "data/new.csv"
    with pytest.raises(ToolError):
        guard_path(root, "../new.csv", must_exist=False)


def test_symlink_out_of_the_root_is_rejected(root: Path) -> None:
    (root / "escape").symlink_to(root.parent / "secret.txt")
    (root / "escape_dir").symlink_to(root.parent)
    _rejected(root, "escape")
    _rejected(root, "escape_dir/secret.txt")


def test_symlink_chain_is_followed_to_its_end(root: Path) -> None:
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("c")
    (root / "c").symlink_to("../secret.txt")
    _rejected(root, "a")
    (root / "inside1").symlink_to("inside2")
    (root / "inside2").symlink_to("data/run1/band.csv")
    assert guard_path(root, "inside1") == (root / "data/run1/band.csv").resolve()


def test_symlink_loop_is_rejected(root: Path) -> None:
    (root / "loop1").symlink_to("loop2")
    (root / "loop2").symlink_to("loop1")
    (root / "self").symlink_to("self")
    _rejected(root, "loop1")
    _rejected(root, "self/x")
    with pytest.raises(ToolError):
        guard_path(root, "loop1", must_exist=False)


def test_nul_byte_is_rejected(root: Path) -> None:
    _rejected(root, "data\x00/run1")


@pytest.mark.parametrize("length", [300, 5000])
def test_very_long_names_are_rejected(root: Path, length: int) -> None:
    _rejected(root, "a" * length)
    _rejected(root, "/".join(["b" * 200] * 30))


def test_a_root_that_is_a_symlink_still_works(root: Path, tmp_path: Path) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(root)
    assert guard_path(alias, "data/run1/band.csv") == (root / "data/run1/band.csv").resolve()
    _rejected(alias, "../secret.txt")


def test_a_prefix_sibling_is_outside(root: Path) -> None:
    sibling = root.parent / (root.name + "2")
    sibling.mkdir()
    (sibling / "x.txt").write_text("x")
    _rejected(root, f"../{root.name}2/x.txt")


def test_no_folder_is_a_path_error(root: Path) -> None:
    with pytest.raises(ToolError) as info:
        guard_path(None, "x")
    assert info.value.kind == "path"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads everything")
def test_unreadable_root_is_handled(root: Path) -> None:
    locked = root / "locked"
    locked.mkdir()
    (locked / "f").write_text("x")
    locked.chmod(0)
    try:
        _rejected(root, "locked/f")
    finally:
        locked.chmod(0o700)
