"""The path guard under a race: a directory inside the folder is swapped, over and over, for
a symbolic link to a directory outside it while the file tools and the report scan run.

Checking a resolved path and then opening it leaks the outside file whenever the swap
lands between the two; walking beneath a directory descriptor with no-follow opens does
not. The outside directory holds files with a marker in their content and a marker name;
neither may ever appear in what a tool returns, and the legitimate file must still be read
when the directory is in place (so the test proves the tools were not simply failing).
"""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from actors.tools import ToolError, ToolLimits
from actors.tools.fs_image import load_image
from actors.tools.fs_list import list_text
from actors.tools.fs_read import read_text
from orchestrator.report import SAMPLE_FOLDER, scan_folder

MARKER = "OUTSIDE-MARKER-5c1e"
MARKER_NAME = "zz_outside_only_entry"
LIMITS = ToolLimits()
PHOTO = (SAMPLE_FOLDER / "plate_photo.png").read_bytes()
SECRET_PHOTO = PHOTO + MARKER.encode()  # still a PNG by its magic bytes, other bytes
RACE_SECONDS = 3.0


class Swaps:
    """How many times the swapping thread put the link in place, and how it ended."""

    def __init__(self) -> None:
        self.count = 0
        self.error: BaseException | None = None


@pytest.fixture
def swaps() -> Swaps:
    return Swaps()


@pytest.fixture
def swapped(tmp_path: Path, swaps: Swaps) -> Iterator[Path]:
    """``root/d`` flips between a real directory and a link to ``outside`` in a thread."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "d").mkdir(parents=True)
    outside.mkdir()
    (root / "d" / "data.txt").write_text("legit\n")
    (root / "d" / "img.png").write_bytes(PHOTO)
    (outside / "data.txt").write_text(MARKER + "\n")
    (outside / "img.png").write_bytes(SECRET_PHOTO)
    (outside / f"{MARKER_NAME}.csv").write_text(MARKER)
    stop = threading.Event()

    def swap() -> None:
        real, parked = root / "d", root / "parked"
        try:
            while not stop.is_set():
                real.rename(parked)
                real.symlink_to(outside)
                swaps.count += 1
                real.unlink()
                parked.rename(real)
        except BaseException as exc:  # the test asserts there was none
            swaps.error = exc

    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    try:
        yield root
    finally:
        stop.set()
        thread.join()


def _race(call: Callable[[], str], swaps: Swaps) -> tuple[int, list[str]]:
    """``call`` over and over for a while: how many answers were legit, and every answer.

    The thread must have swapped the directory all along (else nothing was raced).
    """
    answers: list[str] = []
    before = swaps.count
    deadline = time.monotonic() + RACE_SECONDS
    while time.monotonic() < deadline:
        try:
            answers.append(call())
        except ToolError as exc:
            answers.append("error: " + exc.message)
    assert swaps.error is None
    assert swaps.count > before
    return sum(not a.startswith("error: ") for a in answers), answers


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _no_marker(answers: list[str]) -> None:
    leaked = [a for a in answers if MARKER in a or MARKER_NAME in a]
    assert leaked == [], f"{len(leaked)} of {len(answers)} answers leaked: {leaked[0]!r}"


def test_read_file_never_reads_through_a_swapped_directory(swapped: Path, swaps: Swaps) -> None:
    fds = _open_fds()
    legit, answers = _race(lambda: read_text(swapped, "d/data.txt", 0, None, LIMITS), swaps)
    assert _open_fds() == fds
    _no_marker(answers)
    assert legit > 0
    assert {a for a in answers if not a.startswith("error: ")} == {"legit\n"}


def test_read_image_never_reads_through_a_swapped_directory(swapped: Path, swaps: Swaps) -> None:
    secret = base64.b64encode(SECRET_PHOTO).decode("ascii")
    legit, answers = _race(lambda: load_image(swapped, "d/img.png", "low", LIMITS), swaps)
    assert not any(secret in a for a in answers)
    assert legit > 0


def test_list_dir_never_lists_a_swapped_in_directory(swapped: Path, swaps: Swaps) -> None:
    fds = _open_fds()
    legit, answers = _race(lambda: list_text(swapped, "d", LIMITS), swaps)
    assert _open_fds() == fds
    _no_marker(answers)
    assert legit > 0
    assert any(a.startswith("data.txt  (6 bytes)\nimg.png  (") for a in answers)


def test_the_report_scan_never_walks_into_a_swapped_in_directory(
    swapped: Path, swaps: Swaps
) -> None:
    def scan() -> str:
        return "\n".join(f.path for f in scan_folder(swapped).files)

    fds = _open_fds()
    _, answers = _race(scan, swaps)
    assert _open_fds() == fds
    _no_marker(answers)
    assert any("d/data.txt" in a for a in answers)
