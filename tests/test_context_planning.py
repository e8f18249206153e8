"""The prompt ledger and collapse/compaction planning: totals stay exact, pairing stays valid."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from actors.context import (
    COMPACT_NUDGE_KIND,
    SUMMARY_NUDGE_KIND,
    Estimator,
    PromptLedger,
    apply_folds,
    compaction_prompt,
    fold_stub,
    plan_collapse,
    plan_compaction,
    summary_message,
)
from bus import NUDGE_MARKER, ChatMessage, Fold, ToolCall, nudge_text
from tests.pairing import pairing_problems


def chars(text: str) -> int:
    return len(text)


def estimator() -> Estimator:
    return Estimator("gpt-4o", counter=chars)


def turn(n: int, results: list[int], *, nudge: bool = False) -> list[ChatMessage]:
    """One turn: an assistant message with one call per result size, then the results."""
    calls = tuple(
        ToolCall(id=f"c{n}_{i}", name=f"tool{i}", arguments="{}") for i in range(len(results))
    )
    messages = [ChatMessage(role="assistant", content=f"turn {n}", tool_calls=calls)]
    messages += [
        ChatMessage(role="tool", tool_call_id=call.id, content="x" * size)
        for call, size in zip(calls, results, strict=True)
    ]
    if nudge:
        messages.append(ChatMessage(role="user", content=nudge_text("loop.warning", "stop")))
    return messages


def transcript(*turns: list[ChatMessage]) -> list[ChatMessage]:
    head = [ChatMessage(role="system", content="sys"), ChatMessage(role="user", content="task")]
    return head + [message for messages in turns for message in messages]


def ledger_of(messages: list[ChatMessage]) -> PromptLedger:
    ledger = PromptLedger(estimator())
    turn_of = 0
    for message in messages:
        if message.role == "assistant":
            turn_of += 1
        ledger.extend([message], turn_of)
    return ledger


def recount(messages: list[ChatMessage]) -> int:
    fresh = estimator()
    return sum(fresh.message(message).tokens for message in messages)


def test_the_ledger_counts_each_message_once() -> None:
    calls: list[str] = []

    def spy(text: str) -> int:
        calls.append(text)
        return len(text)

    ledger = PromptLedger(Estimator("gpt-4o", counter=spy))
    messages = transcript(turn(1, [100]), turn(2, [50]))
    ledger.extend(messages[:2], 0)
    ledger.extend(messages[2:], 1)
    assert len(ledger) == len(messages)
    assert ledger.total.tokens == recount(messages)
    assert calls.count("x" * 100) == 1
    assert ledger.entries[3].tool == "tool0"
    assert ledger.entries[3].turn == 1


def test_collapse_folds_only_answered_results_oldest_first() -> None:
    messages = transcript(turn(1, [5_000, 10]), turn(2, [3_000]), turn(3, [9_000]))
    ledger = ledger_of(messages)
    folds, saved = plan_collapse(ledger, min_chars=400)
    # Turn 3's result has not been answered by the model yet: it is never folded.
    assert [fold.index for fold in folds] == [3, 6]
    assert [fold.call_id for fold in folds] == ["c1_0", "c2_0"]
    assert (
        folds[0].stub
        == fold_stub("tool0", 5_000, 1)
        == "[folded: tool0 result, 5,000 chars, turn 1]"
    )
    before = ledger.total.tokens
    for fold in folds:
        ledger.fold(fold)
    assert before - ledger.total.tokens == saved
    assert apply_folds(messages, folds) == []
    assert ledger.total.tokens == recount(messages)
    assert pairing_problems(messages) == []
    assert plan_collapse(ledger, min_chars=400) == ((), 0)  # nothing left to fold


def test_collapse_stops_once_enough_is_saved() -> None:
    ledger = ledger_of(transcript(turn(1, [5_000]), turn(2, [5_000]), turn(3, [10])))
    folds, saved = plan_collapse(ledger, min_chars=400, needed=100)
    assert len(folds) == 1
    assert saved >= 100


def test_each_plan_reads_only_what_the_last_one_could_not_settle() -> None:
    """A long run near its window plans a collapse every turn: entries already folded or
    never foldable are not read again, a result planned but not folded is, and a summary
    (positions move) starts the scan over."""
    messages = transcript(*(turn(n, [10]) for n in range(1, 101)))
    ledger = ledger_of(messages)
    assert plan_collapse(ledger, min_chars=400) == ((), 0)
    assert ledger.fold_scan_start(400) == ledger.last_assistant()  # all settled
    assert ledger.fold_scan_start(50) == 0  # another minimum: from the start

    more = turn(101, [5_000]) + turn(102, [5_000]) + turn(103, [10])
    ledger.extend(more, 101)
    first = ledger.fold_scan_start(400)
    folds, _ = plan_collapse(ledger, min_chars=400, needed=1)  # takes one, leaves one
    # first: turn 100's assistant message; +1 its result, +2 turn 101's, +3 its result
    assert [fold.index for fold in folds] == [first + 3]
    assert ledger.fold_scan_start(400) == first + 3  # planned, not folded yet: kept
    assert [f.index for f in plan_collapse(ledger, min_chars=400)[0]] == [first + 3, first + 5]
    ledger.fold(folds[0])
    assert ledger.fold_scan_start(400) == first + 3
    plan_collapse(ledger, min_chars=400, needed=1)
    assert ledger.fold_scan_start(400) == first + 5

    ledger.splice(2, 10, ChatMessage(role="user", content="summary"), 103)
    assert ledger.fold_scan_start(400) == 0
    assert [f.index for f in plan_collapse(ledger, min_chars=400)[0]] == [first + 5 - 7]


def test_a_fold_that_does_not_match_the_transcript_is_left_alone() -> None:
    messages = transcript(turn(1, [500]), turn(2, [10]))
    wrong = [Fold(index=3, call_id="other", stub="s"), Fold(index=99, call_id="c1_0", stub="s")]
    assert apply_folds(messages, wrong) == wrong
    assert messages[3].content == "x" * 500


def test_compaction_keeps_the_task_and_the_recent_turns() -> None:
    messages = transcript(turn(1, [100]), turn(2, [100], nudge=True), turn(3, [100]), turn(4, []))
    ledger = ledger_of(messages)
    span = plan_compaction(ledger, keep_turns=2)
    assert span is not None
    assert messages[span.start - 1].content == "task"
    assert messages[span.end].content == "turn 3"
    assert (span.first_turn, span.last_turn) == (1, 2)
    summary = summary_message("they read two files", span.first_turn, span.last_turn)
    messages[span.start : span.end] = [summary]
    ledger.splice(span.start, span.end, summary, 2)
    assert pairing_problems(messages) == []
    assert ledger.total.tokens == recount(messages)
    assert (summary.content or "").startswith(f"{NUDGE_MARKER}{SUMMARY_NUDGE_KIND}]")
    assert "turns 1-2" in (summary.content or "")
    # A second compaction summarises the first summary too.
    again = plan_compaction(ledger, keep_turns=1)
    assert again is not None
    assert again.start == span.start
    assert messages[again.end].content == "turn 4"


def test_nothing_to_compact_with_too_few_turns() -> None:
    assert (
        plan_compaction(ledger_of(transcript(turn(1, [10]), turn(2, [10]))), keep_turns=2) is None
    )
    assert plan_compaction(ledger_of(transcript()), keep_turns=1) is None


def test_the_compaction_prompt_is_bounded_and_marked() -> None:
    messages = transcript(*(turn(n, [3_000]) for n in range(1, 30)))[2:]
    request = compaction_prompt(
        messages, first_turn=1, last_turn=29, history_chars=6_000, summary_max_tokens=400
    )
    assert [message.role for message in request] == ["system", "user"]
    assert request[0].content is not None
    assert request[1].content is not None
    assert request[1].content.startswith(f"{NUDGE_MARKER}{COMPACT_NUDGE_KIND}]")
    assert len(request[1].content) < 6_000 + 500
    assert "messages left out" in request[1].content
    assert "Assistant called tool0({})" in request[1].content
    assert "Result of tool0: " in request[1].content
    assert "300 words" in request[0].content


def test_pairing_problems_are_named() -> None:
    call = ToolCall(id="a", name="t", arguments="{}")
    assert pairing_problems([ChatMessage(role="tool", tool_call_id="a", content="x")])
    assert pairing_problems(
        [
            ChatMessage(role="assistant", tool_calls=(call,)),
            ChatMessage(role="user", content="interrupts"),
            ChatMessage(role="tool", tool_call_id="a", content="x"),
        ]
    )
    assert pairing_problems([ChatMessage(role="assistant", tool_calls=(call,))]) == [
        "end: calls ['a'] have no result"
    ]


@settings(max_examples=60, deadline=None)
@given(
    turns=st.lists(
        st.tuples(st.lists(st.integers(0, 3_000), max_size=3), st.booleans()),
        min_size=1,
        max_size=12,
    ),
    keep=st.integers(1, 4),
    min_chars=st.integers(1, 2_000),
)
def test_collapse_then_compaction_always_leaves_a_valid_request(
    turns: list[tuple[list[int], bool]], keep: int, min_chars: int
) -> None:
    messages = transcript(
        *(turn(n, sizes, nudge=nudge) for n, (sizes, nudge) in enumerate(turns, 1))
    )
    ledger = ledger_of(messages)
    folds, _ = plan_collapse(ledger, min_chars=min_chars)
    for fold in folds:
        ledger.fold(fold)
    assert apply_folds(messages, folds) == []
    assert pairing_problems(messages) == []
    span = plan_compaction(ledger, keep_turns=keep)
    if span is not None:
        summary = summary_message("s", span.first_turn, span.last_turn)
        messages[span.start : span.end] = [summary]
        ledger.splice(span.start, span.end, summary, span.last_turn)
        assert sum(message.role == "assistant" for message in messages) == keep
    assert pairing_problems(messages) == []
    assert ledger.total.tokens == recount(messages)
    assert [entry.role for entry in ledger.entries] == [message.role for message in messages]
