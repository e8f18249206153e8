"""The estimator's and ledger's fast paths against the plain algorithm they replaced:
estimates of short texts and tool sets kept, integer sums instead of ``Estimate``
additions, the ledger's totals kept as numbers, calibration without helper calls. Same
numbers on random input."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.context import (
    FALLBACK_MARGIN,
    Calibration,
    Estimate,
    Estimator,
    PromptLedger,
    bpe_counter,
    fold_stub,
)
from actors.context import tokens as tokens_module
from actors.context.calibration import ALPHA
from actors.context.images import part_tokens
from actors.context.tokens import (
    BOUND_CALL_OVERHEAD,
    BOUND_MESSAGE_OVERHEAD,
    BOUND_REQUEST_OVERHEAD,
    BOUND_TOOL_OVERHEAD,
    BOUND_TOOLS_OVERHEAD,
    CALL_OVERHEAD,
    MESSAGE_OVERHEAD,
    REQUEST_OVERHEAD,
    TOOL_OVERHEAD,
)
from bus import (
    ChatMessage,
    Fold,
    ImageDetail,
    ImagePart,
    ImageURL,
    Role,
    TextPart,
    ToolCall,
    ToolSpec,
    image_attachment,
    message_images,
)

MODELS = ("gpt-4o", "gpt-4", "qwen2.5:7b")  # o200k exact, cl100k exact, the fallback


# ------------------------------------------------------------------ the plain algorithm


def plain_text(estimator: Estimator, text: str) -> Estimate:
    """A text counted afresh every time, as before any estimate was kept."""
    if not text:
        return Estimate()
    base = bpe_counter(estimator.encoding)(text)
    if estimator.exact:
        return Estimate(base, base)
    extra = sum(len(run) - math.ceil(len(run) / 3) for run in re.findall(r"\d+", text))
    return Estimate(math.ceil((base + extra) * FALLBACK_MARGIN), base, plain_bound(text))


def plain_bound(text: str) -> int:
    """Any byte-fallback tokenizer's most tokens of ``text``: its bytes and a prefix."""
    escaped = sum(4 if char == '"' else 5 for char in text if char in "\"'<>&")
    return len(text.encode("utf-8", "surrogatepass")) + 1 + escaped


def framing(estimator: Estimator, tokens: int, bound: int) -> Estimate:
    """Framing: ``bound`` is kept only for a model whose tokenizer is unknown."""
    return Estimate(tokens, tokens, 0 if estimator.exact else bound)


def plain_message(estimator: Estimator, message: ChatMessage) -> Estimate:
    """One message summed with ``Estimate`` additions, its text from ``message_images``."""
    total = framing(estimator, MESSAGE_OVERHEAD, BOUND_MESSAGE_OVERHEAD)
    text, parts = message_images(message)
    if text:
        total = total + plain_text(estimator, text)
    for part in parts:
        if isinstance(part, TextPart):
            total = total + plain_text(estimator, part.text)
        else:
            price = part_tokens(part)
            exact = estimator.exact and part.image_url.detail != "auto"
            bound = 0 if estimator.exact else price
            total = total + Estimate(price, price if exact else 0, bound)
    if message.name:
        total = total + plain_text(estimator, message.name) + framing(estimator, 1, 1)
    if message.tool_call_id:
        total = total + plain_text(estimator, message.tool_call_id)
    for call in message.tool_calls:
        total = total + framing(estimator, CALL_OVERHEAD, BOUND_CALL_OVERHEAD)
        total = total + plain_text(estimator, call.name) + plain_text(estimator, call.arguments)
    return total


def plain_tools(estimator: Estimator, specs: tuple[ToolSpec, ...]) -> Estimate:
    tools_framing = BOUND_TOOLS_OVERHEAD if specs else 0
    total = framing(estimator, REQUEST_OVERHEAD, BOUND_REQUEST_OVERHEAD + tools_framing)
    for spec in specs:
        total = total + framing(estimator, TOOL_OVERHEAD, BOUND_TOOL_OVERHEAD)
        for text in (spec.name, spec.description, spec.parameters):
            total = total + plain_text(estimator, text)
    return total


# ------------------------------------------------------------------ random messages

# Few distinct short texts (so estimates are found kept) mixed with longer ones, digits.
_SHORT = st.sampled_from(["", "echo", "read_file", "call_1", "call_22", "step 7", "42", "ok"])
_TEXT = st.one_of(_SHORT, st.text(max_size=80), st.from_regex(r"[a-z ]{0,60}\d{1,12}"))
_DETAIL: st.SearchStrategy[ImageDetail] = st.sampled_from(["auto", "low", "high"])
_ROLE: st.SearchStrategy[Role] = st.sampled_from(["system", "user", "assistant", "tool"])
_URL = "data:image/png;base64,iVBORw0KGgo="  # a header too short to read: the largest price


@st.composite
def _messages(draw: st.DrawFn) -> ChatMessage:
    role = draw(_ROLE)
    content = draw(st.one_of(st.none(), _TEXT))
    if role == "tool" and draw(st.booleans()):  # an attached image in a tool result
        content = f"{content or ''}\n{image_attachment(_URL, draw(_DETAIL))}"
    parts: tuple[TextPart | ImagePart, ...] = ()
    if role == "user" and draw(st.booleans()):
        parts = (
            TextPart(text=draw(_TEXT)),
            ImagePart(image_url=ImageURL(url=_URL, detail=draw(_DETAIL))),
        )
    calls: tuple[ToolCall, ...] = ()
    if role == "assistant":
        calls = tuple(
            ToolCall(id=draw(_SHORT) or "c", name=draw(_SHORT) or "t", arguments=draw(_TEXT))
            for _ in range(draw(st.integers(0, 3)))
        )
    return ChatMessage(
        role=role,
        content=content,
        tool_calls=calls,
        tool_call_id=draw(_SHORT) if role == "tool" else None,
        name=draw(st.one_of(st.none(), _SHORT)),
        parts=parts,
    )


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(MODELS), st.lists(_messages(), max_size=8))
def test_message_estimates_equal_the_plain_sums(model: str, messages: list[ChatMessage]) -> None:
    estimator = Estimator(model)  # the default counter: short texts' estimates are kept
    for message in messages * 2:  # a second time: found kept
        assert estimator.message(message) == plain_message(estimator, message)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(MODELS), st.lists(_TEXT, max_size=20))
def test_kept_estimates_equal_fresh_counts_even_after_the_lot_is_dropped(
    model: str, texts: list[str]
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tokens_module, "SHORT_TEXT_CACHE", 3)  # dropped every few texts
        estimator = Estimator(model)
        for text in texts + texts[::-1]:
            before = estimator.calls
            assert estimator.text(text) == plain_text(estimator, text)
            assert estimator.calls == before + (1 if text else 0)  # kept or not: one text


def test_a_counter_passed_in_is_called_for_every_text() -> None:
    counted: list[str] = []

    def spy(text: str) -> int:
        counted.append(text)
        return len(text)

    estimator = Estimator("gpt-4o", counter=spy)
    call = ToolCall(id="c", name="echo", arguments="{}")
    for _ in range(3):
        estimator.message(ChatMessage(role="assistant", tool_calls=(call,)))
        estimator.tools((ToolSpec(name="echo", description="d", parameters="{}"),))
    assert counted.count("echo") == 6


@pytest.mark.parametrize("model", MODELS)
def test_a_tool_set_estimate_is_kept_and_counts_its_texts_each_time(model: str) -> None:
    specs = (
        ToolSpec(name="echo", description="Return the text it is given.", parameters="{}"),
        ToolSpec(name="read", description="", parameters='{"type":"object"}' * 10),
    )
    estimator = Estimator(model)
    first = estimator.tools(specs)
    calls = estimator.calls
    assert first == plain_tools(estimator, specs)
    assert estimator.tools(list(specs)) == first  # any iterable of the same specs
    assert estimator.calls == 2 * calls == 2 * 5  # the empty description is no text
    assert estimator.tools(specs[:1]) == plain_tools(estimator, specs[:1])


# ------------------------------------------------------------------ the ledger's totals


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(MODELS),
    st.lists(_messages(), min_size=3, max_size=12),
    st.lists(st.integers(0, 11), max_size=4),
    st.integers(0, 11),
)
def test_the_ledgers_totals_are_the_sums_of_its_entries(
    model: str, messages: list[ChatMessage], folds: list[int], splice_at: int
) -> None:
    ledger = PromptLedger(Estimator(model))
    ledger.extend(messages[:2], 0)
    ledger.extend(messages[2:], 1)

    def sums() -> Estimate:
        return Estimate(
            sum(entry.estimate.tokens for entry in ledger.entries),
            sum(entry.estimate.floor for entry in ledger.entries),
            sum(entry.estimate.bound for entry in ledger.entries),
        )

    assert ledger.total == sums() == Estimate(ledger.tokens, ledger.floor, ledger.bound)
    for index in folds:
        if index < len(ledger):
            entry = ledger.entries[index]
            stub = fold_stub(entry.tool, entry.chars, entry.turn)
            ledger.fold(Fold(index=index, call_id=entry.call_id or "", stub=stub))
            assert ledger.total == sums()
    start = min(splice_at, len(ledger) - 1)
    ledger.splice(start, min(start + 3, len(ledger)), ChatMessage(role="user", content="s"), 1)
    assert ledger.total == sums()
    ledger.reset()
    assert ledger.total == Estimate()
    assert len(ledger) == 0


# ------------------------------------------------------------------ calibration


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-5, 10**6), st.integers(-5, 10**6)), max_size=10),
    st.integers(0, 10**7),
    st.floats(0.1, 5),
    st.floats(0.1, 5),
)
def test_calibration_equals_the_clamped_moving_average(
    samples: list[tuple[int, int]], tokens: int, low: float, high: float
) -> None:
    calibration = Calibration(low=low, high=high)
    ratio: float | None = None
    for estimated, reported in samples:
        if estimated > 0 and reported > 0:
            sample = min(max(reported / estimated, low), high)
            ratio = sample if ratio is None else ratio + ALPHA * (sample - ratio)
        assert calibration.observe("m", estimated, reported) == (ratio or 1.0)
        assert calibration.apply("m", tokens) == math.ceil(tokens * (ratio or 1.0))
    assert calibration.apply("other", tokens) == tokens
