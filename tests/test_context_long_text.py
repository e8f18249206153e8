"""Texts longer than the tokenizer takes at once: counted in pieces, never a failed run.

``bpe-openai`` refuses a text of 1,000,000 characters or one that makes more than 200,000
tokens. A library or CLI run has no API limit on its task, so the estimator counts long
texts in pieces, and a task far too long for the window ends the run by the context rules
(``blocking_limit``), not with ``internal.error``.
"""

from __future__ import annotations

import importlib
import random
import warnings

import anyio
import pytest

from actors.context import Estimator, bpe_counter
from actors.context.tokens import CHUNK_CHARS
from bus import ExitReason
from orchestrator.runtime import RunSpec, Runtime


def _prose(chars: int) -> str:
    words = ["the", "plate", "reader", "logged", "every", "well,", "then", "exported\n\n"]
    rng = random.Random(7)
    text = " ".join(rng.choice(words) for _ in range(chars // 4))
    return text[:chars]


def _whole_count(encoding: str, text: str) -> int:
    """The count of ``text`` in one piece (it must be within the tokenizer's limits)."""
    with warnings.catch_warnings():  # its data loader uses a deprecated importlib call
        warnings.simplefilter("ignore", DeprecationWarning)
        vocabulary = importlib.import_module("bpe_openai").get_encoding(encoding)
    return len(vocabulary.encode_ordinary(text))


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_pieces_count_what_the_whole_text_counts(encoding: str) -> None:
    count = bpe_counter(encoding)
    for text in (_prose(5 * CHUNK_CHARS + 17), "x" * (3 * CHUNK_CHARS + 1), "  " * CHUNK_CHARS):
        assert len(text) > CHUNK_CHARS
        pieces = count(text)
        whole = _whole_count(encoding, text)
        assert abs(pieces - whole) <= len(text) // CHUNK_CHARS, (pieces, whole)


def test_texts_past_the_tokenizers_limits_are_counted() -> None:
    count = bpe_counter("cl100k_base")
    half = _prose(750_000)
    whole = 2 * _whole_count("cl100k_base", half)
    pieces = count(half + half)  # past 1,000,000 characters
    assert abs(pieces - whole) <= 1_500_000 // CHUNK_CHARS, (pieces, whole)
    rng = random.Random(3)
    cjk = "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(150_000))
    assert count(cjk) > 200_000  # past 200,000 tokens
    emoji = "\U0001f9ea" * 120_000  # 4 UTF-8 bytes a character
    assert count(emoji) > 200_000


def test_the_estimator_gives_a_long_text_an_estimate() -> None:
    tenth = _prose(500_000)
    text = tenth * 10
    expected = 10 * _whole_count("o200k_base", tenth)
    slack = len(text) // CHUNK_CHARS + 10  # a token or so a cut and a join
    exact = Estimator("gpt-4o").text(text)
    assert exact.tokens == exact.floor
    assert abs(exact.tokens - expected) <= slack, (exact.tokens, expected)
    other = Estimator("some-local-model").text(text)
    assert abs(other.floor - 10 * _whole_count("cl100k_base", tenth)) <= slack
    assert other.tokens >= other.floor * 1.1


@pytest.mark.asyncio
async def test_a_five_million_character_task_ends_by_the_context_rules() -> None:
    async with Runtime() as runtime:
        handle = await runtime.start(RunSpec(task=_prose(5_000_000)))
        with anyio.fail_after(120):
            result = await handle.result()
    assert (result.exit_reason, result.cause) == (
        ExitReason.BLOCKING_LIMIT,
        "context.blocking_limit",
    )
    assert result.llm_requests == 0
    assert "estimated at" in result.detail
