"""The race-free walker beneath a folder's descriptor (``actors.tools.folder``) and the
file tools on it: ``..``, links at every position, special files, malformed and absolute
paths, what an entry does when its name is swapped after the walk, and no leaked fds."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from actors.tools import PATH_ERROR, ToolError, ToolLimits, guard_path
from actors.tools.folder import MAX_LINKS, MAX_PATH_CHARS, Folder, PathRefused
from actors.tools.fs_image import load_image
from actors.tools.fs_list import list_text
from actors.tools.fs_read import read_text
from orchestrator.report import scan_folder

LIMITS = ToolLimits()
SECRET = "OUTSIDE-7d2b"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """``root`` with ``a/b/f.txt``, ``top.txt`` and a FIFO, beside ``secret``."""
    folder = tmp_path / "root"
    (folder / "a" / "b").mkdir(parents=True)
    (folder / "a" / "b" / "f.txt").write_text("inner\n")
    (folder / "top.txt").write_text("top\n")
    os.mkfifo(folder / "pipe")
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "s.txt").write_text(SECRET)
    (tmp_path / "secret.txt").write_text(SECRET)
    return folder


def _read(root: Path, path: str) -> str:
    return read_text(root, path, 0, None, LIMITS)


def _refused(call: Callable[[], object]) -> None:
    with pytest.raises(ToolError) as info:
        call()
    assert (info.value.kind, info.value.message) == ("path", PATH_ERROR)


def _names(root: Path, path: str) -> tuple[str, ...]:
    with Folder(root) as folder, folder.entry(path) as entry:
        return entry.names


# ---------------------------------------------------------------------------- ..


@pytest.mark.parametrize(
    ("path", "names"),
    [
        ("a/../top.txt", ("top.txt",)),
        ("a/b/../../a/b/f.txt", ("a", "b", "f.txt")),
        ("a/b/..", ("a",)),
        ("./a/./b/.//f.txt", ("a", "b", "f.txt")),
        ("a/..", ()),
    ],
)
def test_dot_dot_moves_within_the_folder(root: Path, path: str, names: tuple[str, ...]) -> None:
    assert _names(root, path) == names


@pytest.mark.parametrize("path", ["..", "../secret.txt", "a/../../secret.txt", "a/b/../../.."])
def test_dot_dot_never_climbs_above_the_folder(root: Path, path: str) -> None:
    with Folder(root) as folder, pytest.raises(PathRefused):
        folder.entry(path)
    _refused(lambda: _read(root, path))
    _refused(lambda: list_text(root, path, LIMITS))


def test_dot_dot_after_a_link_is_the_parent_of_its_target(root: Path) -> None:
    # Like the kernel: a/b/link -> ../.. is the folder, so link/../x climbs out.
    (root / "a" / "b" / "up").symlink_to("../..")
    (root / "hop").symlink_to("a/b")
    assert _names(root, "a/b/up/top.txt") == ("top.txt",)
    assert _names(root, "hop/../b/f.txt") == ("a", "b", "f.txt")  # hop's parent is a
    _refused(lambda: _read(root, "a/b/up/../secret.txt"))


# ---------------------------------------------------------------------------- links


@pytest.mark.parametrize(
    ("link", "target", "path"),
    [
        ("a/b/lf", "f.txt", "a/b/lf"),  # last component
        ("a/lb", "b", "a/lb/f.txt"),  # middle
        ("la", "a", "la/b/f.txt"),  # first
        ("la", "a/b/f.txt", "la"),  # first and last
        ("a/b/lup", "../../top.txt", "a/b/lup"),  # through .. inside
    ],
)
def test_a_link_inside_the_folder_is_followed_at_any_position(
    root: Path, link: str, target: str, path: str
) -> None:
    (root / link).symlink_to(target)
    assert _read(root, path) in ("inner\n", "top\n")


@pytest.mark.parametrize(
    ("link", "path"),
    [("a/b/out", "a/b/out"), ("a/out", "a/out/s.txt"), ("out", "out/s.txt")],
)
@pytest.mark.parametrize("absolute", [False, True])
def test_a_link_out_of_the_folder_is_refused_at_any_position(
    root: Path, link: str, path: str, absolute: bool
) -> None:
    depth = link.count("/") + 1
    target = root.parent / "secret" if path != link else root.parent / "secret.txt"
    (root / link).symlink_to(target if absolute else "../" * depth + target.name)
    assert SECRET in (root / path).read_text()  # the OS does follow it
    _refused(lambda: _read(root, path))
    _refused(lambda: guard_path(root, path))


def test_an_absolute_link_into_the_folder_is_followed(root: Path) -> None:
    (root / "abs").symlink_to(root / "a" / "b")
    (root / "abs_root").symlink_to(root)
    assert _read(root, "abs/f.txt") == "inner\n"
    assert _read(root, "abs_root/top.txt") == "top\n"
    assert _names(root, "abs/f.txt") == ("a", "b", "f.txt")


def test_links_are_followed_up_to_the_limit_and_no_further(root: Path) -> None:
    for i in range(MAX_LINKS + 1):
        (root / f"l{i}").symlink_to(f"l{i + 1}" if i < MAX_LINKS else "top.txt")
    assert _read(root, f"l{1}") == "top\n"  # MAX_LINKS links
    _refused(lambda: _read(root, "l0"))  # one more


def test_a_dangling_link_is_missing(root: Path) -> None:
    (root / "dangling").symlink_to("nowhere")
    _refused(lambda: _read(root, "dangling"))
    assert "dangling  (unavailable link)" in list_text(root, ".", LIMITS)


# ---------------------------------------------------------------------------- kinds


def test_a_fifo_is_refused_without_blocking(root: Path) -> None:
    (root / "to_pipe").symlink_to("pipe")
    for path in ("pipe", "to_pipe"):
        with pytest.raises(ToolError, match="is not a regular file"):
            _read(root, path)
        with pytest.raises(ToolError, match="is not a regular file"):
            load_image(root, path, "low", LIMITS)
        with pytest.raises(ToolError, match="is a file, not a directory"):
            list_text(root, path, LIMITS)
    assert "pipe" not in {f.path for f in scan_folder(root).files}


def test_a_directory_is_not_a_file_nor_a_file_a_directory(root: Path) -> None:
    (root / "to_a").symlink_to("a")
    for path in ("a", "to_a", ".", "a/b/.."):
        with pytest.raises(ToolError, match="is a directory; use list_dir"):
            _read(root, path)
    with pytest.raises(ToolError, match="is a file, not a directory"):
        list_text(root, "top.txt", LIMITS)
    _refused(lambda: _read(root, "top.txt/x"))  # a file used as a directory
    assert list_text(root, "to_a", LIMITS) == "b/"


# ---------------------------------------------------------------------------- malformed


@pytest.mark.parametrize(
    "path",
    [
        "top.txt\x00",
        "\x00",
        "a/\x00/b",
        "x" * 256,  # one name over NAME_MAX
        "a/" * (MAX_PATH_CHARS // 2) + "top.txt",  # over PATH_MAX, every part valid
        "/".join(["b" * 200] * 30),
    ],
)
def test_malformed_paths_get_the_one_answer(root: Path, path: str) -> None:
    _refused(lambda: _read(root, path))
    _refused(lambda: list_text(root, path, LIMITS))
    _refused(lambda: guard_path(root, path))


def test_a_long_path_within_the_limit_works(root: Path) -> None:
    path = "./" * ((MAX_PATH_CHARS - len("top.txt")) // 2) + "top.txt"
    assert len(path) <= MAX_PATH_CHARS
    assert _read(root, path) == "top\n"


# ---------------------------------------------------------------------------- absolute


def test_absolute_paths_must_spell_the_folder(root: Path, tmp_path: Path) -> None:
    assert _read(root, str(root / "a" / "b" / "f.txt")) == "inner\n"
    assert _read(root, f"//{root}/./a//b/f.txt") == "inner\n"
    assert list_text(root, str(root), LIMITS).startswith("a/\npipe")
    alias = tmp_path / "alias"
    alias.symlink_to(root)
    assert _read(alias, str(alias / "top.txt")) == "top\n"  # the folder as given
    assert _read(alias, str(root / "top.txt")) == "top\n"  # the folder resolved
    sibling = tmp_path / "root2"
    sibling.mkdir()
    (sibling / "x.txt").write_text(SECRET)
    for path in (str(tmp_path / "secret.txt"), str(sibling / "x.txt"), "/", "/etc/passwd"):
        _refused(lambda path=path: _read(root, path))  # type: ignore[misc]
    _refused(lambda: _read(root, f"{root}/../secret.txt"))


# ---------------------------------------------------------------------------- after the walk


def test_a_link_swapped_in_after_the_walk_is_not_followed(root: Path) -> None:
    with Folder(root) as folder, folder.entry("top.txt") as entry:
        (root / "top.txt").unlink()
        (root / "top.txt").symlink_to(root.parent / "secret.txt")
        with pytest.raises(PathRefused):
            entry.open(os.O_RDONLY)


def test_a_directory_swapped_after_the_walk_keeps_the_entry_inside(root: Path) -> None:
    with Folder(root) as folder, folder.entry("a/b/f.txt") as entry:
        (root / "a").rename(root / "parked")
        (root / "a").symlink_to(root.parent / "secret")
        (root / "parked" / "b" / "f.txt").rename(root / "parked" / "b" / "s.txt")
        (root / "parked" / "b" / "f.txt").write_text("still inside\n")
        fd = entry.open(os.O_RDONLY)
    with open(fd, encoding="utf-8") as file:
        assert file.read() == "still inside\n"


# ---------------------------------------------------------------------------- guard_path


def test_guard_path_names_the_physical_path(root: Path) -> None:
    (root / "la").symlink_to("a/b")
    real = root.resolve()
    assert guard_path(root, "la/f.txt") == real / "a" / "b" / "f.txt"
    assert guard_path(root, "a/new/../b/x.txt", must_exist=False) == real / "a" / "b" / "x.txt"
    assert guard_path(root, "la/new/more", must_exist=False) == real / "a" / "b" / "new" / "more"
    with pytest.raises(ToolError):
        guard_path(root, "new/../../x", must_exist=False)


# ---------------------------------------------------------------------------- fds


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_no_descriptor_is_left_open(root: Path) -> None:
    (root / "loop").symlink_to("loop")
    (root / "in").symlink_to("a/b")
    (root / "out").symlink_to("../secret")
    before = _open_fds()
    for path in ("a/b/f.txt", "in/f.txt", "out/s.txt", "loop", "a/b/../../..", "pipe", "a", "x\0"):
        for call in (
            lambda p=path: _read(root, p),
            lambda p=path: list_text(root, p, LIMITS),
            lambda p=path: load_image(root, p, "low", LIMITS),
            lambda p=path: guard_path(root, p),
        ):
            try:
                call()
            except ToolError:
                pass
    scan_folder(root)
    assert _open_fds() == before
