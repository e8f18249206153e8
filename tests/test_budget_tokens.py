"""Token and cost accounting (actors.budget.tokens): the warning, ceilings, the target and
diminishing returns, decided without a bus."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import actors.budget.tokens as token_budget
from actors.budget.tokens import (
    CONTINUE_KIND,
    WARNING_KIND,
    BudgetNudge,
    BudgetStop,
    TokenAccount,
    TokenLimits,
)


def test_public_api_is_pinned() -> None:
    assert token_budget.__all__ == [
        "CONTINUE_KIND",
        "DIMINISHING_AFTER",
        "DIMINISHING_TOKENS",
        "NUDGE_FRACTION",
        "WARNING_KIND",
        "BudgetMode",
        "BudgetNudge",
        "BudgetStop",
        "TokenAccount",
        "TokenLimits",
    ]


def ceiling(**limits: Any) -> TokenAccount:
    return TokenAccount(TokenLimits(**limits))


def test_warning_at_90_percent_once_with_the_real_numbers() -> None:
    account = ceiling(output_tokens=30_000)
    assert account.replied(100, 26_000, ended_turn=False) is None  # 86%
    warning = account.replied(200, 27_100, ended_turn=False)
    assert warning == BudgetNudge(
        WARNING_KIND,
        "Output-token budget 90% used (27,100 / 30,000); keep working, do not summarise.",
    )
    assert account.replied(300, 28_500, ended_turn=False) is None  # once per run
    assert account.replied(400, 29_999, ended_turn=True) is None


def test_warning_is_skipped_when_a_reply_jumps_past_the_ceiling() -> None:
    account = ceiling(output_tokens=15_000)
    assert account.replied(0, 12_000, ended_turn=False) is None
    assert account.replied(0, 15_000, ended_turn=False) is None  # the stop follows instead
    assert account.exhausted() == BudgetStop(
        "budget.output_tokens",
        "The run produced 15,000 completion tokens, reaching its budget of 15,000 "
        "(budget.max_output_tokens).",
    )


def test_output_ceiling_is_reached_at_the_budget_not_before() -> None:
    account = ceiling(output_tokens=1_000)
    account.replied(0, 999, ended_turn=False)
    assert account.exhausted() is None
    account.replied(0, 1_000, ended_turn=False)
    stop = account.exhausted()
    assert stop is not None
    assert stop.cause == "budget.output_tokens"


def test_input_token_ceiling_sums_prompt_tokens() -> None:
    account = ceiling(input_tokens=5_000)
    account.replied(4_999, 10, ended_turn=False)
    assert account.exhausted() is None
    account.replied(5_200, 20, ended_turn=False)
    assert account.exhausted() == BudgetStop(
        "budget.input_tokens",
        "The run's requests sent 5,200 prompt tokens, reaching its budget of 5,000 "
        "(budget.max_input_tokens).",
    )


def test_cost_uses_both_prices_per_million() -> None:
    account = ceiling(cost=0.05, input_price_per_million=2.5, output_price_per_million=10.0)
    account.replied(10_000, 2_000, ended_turn=False)  # 0.025 + 0.020
    assert account.cost == pytest.approx(0.045)
    assert account.exhausted() is None
    account.replied(12_000, 2_000, ended_turn=False)  # 0.030 + 0.020
    stop = account.exhausted()
    assert stop is not None
    assert stop.cause == "budget.cost"
    assert "0.0500" in stop.detail
    assert "12,000 prompt and 2,000 completion tokens" in stop.detail


def test_no_limits_means_no_answers() -> None:
    account = ceiling()
    assert not account.limits.any
    assert account.replied(10**9, 10**9, ended_turn=True) is None
    assert account.exhausted() is None


def target(amount: int) -> TokenAccount:
    return TokenAccount(TokenLimits(output_tokens=amount, mode="target"))


def test_target_continues_below_90_percent_and_completes_at_it() -> None:
    account = target(10_000)
    first = account.replied(0, 4_000, ended_turn=True)
    assert first == BudgetNudge(
        CONTINUE_KIND,
        "Output-token target 40% reached (4,000 / 10,000), continuation 1; keep working, "
        "do not summarise.",
        continues=True,
    )
    assert account.replied(0, 6_000, ended_turn=False) is None  # a tool-calling turn
    second = account.replied(0, 7_000, ended_turn=True)
    assert isinstance(second, BudgetNudge)
    assert second.continues
    assert "continuation 2" in second.text
    assert account.replied(0, 9_000, ended_turn=True) is None  # 90%: the run completes
    assert account.continuations == 2


def test_target_mode_is_no_ceiling_and_gives_no_warning() -> None:
    account = target(1_000)
    assert account.replied(0, 950, ended_turn=False) is None
    account.replied(0, 5_000, ended_turn=False)
    assert account.exhausted() is None


def ended(account: TokenAccount, increments: list[int]) -> list[BudgetNudge | BudgetStop | None]:
    answers = []
    total = account.completion_tokens
    for increment in increments:
        total += increment
        answers.append(account.replied(0, total, ended_turn=True))
    return answers


def test_diminishing_returns_stop_after_three_continuations_and_two_small_increments() -> None:
    # The initial answer, then continuations adding 3,000, 2,500, 400 and 300 (seed 001).
    answers = ended(target(30_000), [3_000, 3_000, 2_500, 400, 300])
    assert [type(a).__name__ for a in answers] == ["BudgetNudge"] * 4 + ["BudgetStop"]
    stop = answers[-1]
    assert stop == BudgetStop(
        "budget.diminishing_returns",
        "After 4 continuations the last two added only 400 and 300 completion tokens "
        "(under 500 each); 9,200 of the 30,000 target.",
    )


@pytest.mark.parametrize(
    "increments",
    [
        [3_000, 400, 300],  # small increments, but only 2 continuations so far
        [3_000, 3_000, 2_500, 300, 600],  # one small increment, then a big one
        [3_000, 3_000, 400, 500],  # 500 is not "fewer than 500"
    ],
)
def test_diminishing_returns_need_three_continuations_and_two_small_increments(
    increments: list[int],
) -> None:
    answers = ended(target(100_000), increments)
    assert all(isinstance(a, BudgetNudge) for a in answers)


def test_an_increment_counts_every_turn_between_two_ends_of_turn() -> None:
    """Short tool-calling turns after a continuation add up: they are one increment."""
    account = target(100_000)
    ended(account, [3_000, 3_000, 3_000])  # 3 continuations made
    total = account.completion_tokens
    for _ in range(2):  # two continuations, each 6 tool-calling turns of 100 tokens + 50
        for _ in range(6):
            total += 100
            assert account.replied(0, total, ended_turn=False) is None
        total += 50
        answer = account.replied(0, total, ended_turn=True)
        assert isinstance(answer, BudgetNudge), answer
    assert account.last_increment == 650


def test_reaching_the_target_wins_over_diminishing_returns() -> None:
    # At the 4th end of turn 3 continuations were made and the last two added 300 each,
    # but 9,100 ≥ 90% of 10,000: the run completes.
    answers = ended(target(10_000), [8_200, 300, 300, 300])
    assert all(isinstance(a, BudgetNudge) for a in answers[:3])
    assert answers[3] is None


@given(st.lists(st.integers(min_value=0, max_value=5_000), max_size=40))
def test_the_warning_comes_at_most_once_and_only_between_90_and_100_percent(
    replies: list[int],
) -> None:
    account = ceiling(output_tokens=20_000)
    total = 0
    warnings = 0
    for tokens in replies:
        total += tokens
        answer = account.replied(0, total, ended_turn=False)
        if answer is not None:
            warnings += 1
            assert 18_000 <= total < 20_000
    assert warnings <= 1
    crossed = any(18_000 <= t < 20_000 for t in _running(replies))
    assert warnings == (1 if crossed else 0)


def _running(values: list[int]) -> list[int]:
    out, total = [], 0
    for value in values:
        total += value
        out.append(total)
    return out
