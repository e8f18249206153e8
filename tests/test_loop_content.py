"""Content loops: a chanting model is caught while it streams; markdown that merely looks
alike (code blocks, tables, lists, headings) is not, however the stream is cut."""

from __future__ import annotations

import msgspec
import pytest

from actors.loop import GEMINI, OPENCLAW, STRICT, ContentConfig, LoopConfig, LoopDetector

PARAGRAPH = (
    "I will now check the configuration once more to be sure that everything is in order "
    "before I continue with the next part of the task. "
)
CUTS = [1, 2, 3, 5, 8, 13, 50, 10_000]

DOCUMENT = (
    "# Quarterly report\n\nThis report covers the usual figures.\n\n"
    "## Code\n\n```python\n" + "total = total + compute(row)  # same line again\n" * 40 + "```\n\n"
    "## Table\n\n| name | value |\n|------|-------|\n"
    + "| the same row label | the same value |\n" * 30
    + "\n## Steps\n\n"
    + "".join(
        f"- Step {i}: verify that the configuration file is valid and the server responds.\n"
        for i in range(40)
    )
    + "".join("- Verify that the configuration file is valid and the server responds.\n" * 30)
    + "".join(
        f"{i}. Check the item with the same long prefix and then move on.\n" for i in range(40)
    )
    + "".join("> Quoted line that repeats in a long blockquote of the same text.\n" * 20)
    + "\n---\n\nThe end.\n"
)

CONTENT_ONLY = msgspec.structs.replace(LoopConfig(), content=ContentConfig(enabled=True))


def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def first_offence(detector: LoopDetector, text: str, size: int) -> int | None:
    """Characters streamed when the detector first objects, or None."""
    sent = 0
    for piece in pieces(text, size):
        sent += len(piece)
        if detector.feed_text(piece).level != "none":
            return sent
    return None


@pytest.mark.parametrize("size", CUTS)
def test_a_paragraph_streamed_twenty_times_is_caught_while_streaming(size: int) -> None:
    caught = first_offence(LoopDetector(GEMINI), PARAGRAPH * 20, size)
    assert caught is not None
    # ten occurrences of a chunk: caught within the 11th repetition (or the single delta)
    assert caught <= max(11 * len(PARAGRAPH), size)


@pytest.mark.parametrize("size", CUTS)
def test_markdown_that_looks_alike_does_not_trip(size: int) -> None:
    assert first_offence(LoopDetector(GEMINI), DOCUMENT, size) is None


def test_a_long_list_sharing_a_prefix_is_not_a_loop() -> None:
    # no markers at all: only the distinct-periods rule keeps this quiet
    text = "".join(
        f"Item {i:03d} of the inventory is stored in warehouse {i % 7}. " for i in range(80)
    )
    assert first_offence(LoopDetector(GEMINI), text, 7) is None


def test_a_paragraph_longer_than_the_distance_limit_is_not_caught() -> None:
    # gemini's thresholds: ten occurrences at most 250 characters apart on average
    long_paragraph = PARAGRAPH + (
        "Afterwards the results are compared with last week's numbers, the differences are "
        "written down, and a short summary goes to the team lead for review. "
    )
    assert len(long_paragraph) > 250
    assert first_offence(LoopDetector(GEMINI), long_paragraph * 20, 40) is None


def test_fences_split_across_deltas_still_open_a_code_block() -> None:
    detector = LoopDetector(GEMINI)
    for piece in ["Here:\n`", "`", "`text\n"]:
        assert detector.feed_text(piece).level == "none"
    assert first_offence(detector, PARAGRAPH * 20, 9) is None
    detector.feed_text("``")
    detector.feed_text("`\n")
    assert first_offence(detector, PARAGRAPH * 20, 9) is not None


def test_an_all_capitals_chant_is_caught_with_qwens_divider_fix() -> None:
    # gemini's divider class is a range that includes capitals: each "RETRY" was skipped
    assert first_offence(LoopDetector(GEMINI), "RETRY" * 200, 5) is not None


def test_first_offence_cuts_and_nudges_second_stops() -> None:
    detector = LoopDetector(CONTENT_ONLY)
    first = next(
        d for p in pieces(PARAGRAPH * 20, 10) if (d := detector.feed_text(p)).level != "none"
    )
    assert (first.level, first.detector, first.cause) == ("critical", "content", "loop.content")
    assert first.nudge is not None
    assert "repeating" in first.nudge
    # the rest of the cut stream is ignored
    assert detector.feed_text(PARAGRAPH * 20).level == "none"
    detector.new_stream()
    second = detector.feed_text(PARAGRAPH * 20)
    assert (second.level, second.detector, second.nudge) == ("break", "content", None)


def test_tool_calls_and_new_streams_reset_tracking() -> None:
    detector = LoopDetector(GEMINI)
    half = PARAGRAPH * 6
    for _ in range(5):
        assert first_offence(detector, half, 17) is None
        detector.propose("read_file", '{"path": "x"}')
        detector.new_stream()


def test_content_detection_is_off_in_strict_and_openclaw() -> None:
    for preset in (STRICT, OPENCLAW):
        assert first_offence(LoopDetector(preset), PARAGRAPH * 40, 10) is None
