"""One function ends a run, one stored result shape (issue #31)."""

from __future__ import annotations

from bus import ExitReason, Outcome, RunFinished, Usage, cause_hint
from orchestrator.result import end_result, finished_message, finished_result, result_summary


def test_end_result_takes_outcome_and_hint_from_the_reason_and_the_cause_table() -> None:
    done = end_result("r", "t", ExitReason.COMPLETED, "model.end_turn", "d")
    assert (done.outcome, done.hint) == (Outcome.DONE, cause_hint("model.end_turn"))
    refused = end_result(
        "r", "t", ExitReason.PROMPT_TOO_LONG, "context.prompt_too_long", "d", shortened=True
    )
    assert refused.outcome is Outcome.FAILED
    assert refused.hint == cause_hint("context.prompt_too_long", shortened=True)
    assert refused.hint != cause_hint("context.prompt_too_long")


def test_a_run_known_only_by_its_run_finished_is_stored_in_the_same_shape() -> None:
    """The daemon and the fleet store a run that ended before a restart from its
    ``RunFinished``; its stored result has every key any result has (and no message tag)."""
    finished = RunFinished(
        run_id="r",
        exit_reason=ExitReason.MAX_TURNS,
        cause="budget.max_turns",
        outcome=Outcome.FAILED,
        detail="Reached the limit of 3 turns (max_turns).",
        hint="as published",
        turns=3,
        llm_requests=4,
        tool_calls=2,
        usage=Usage(prompt_tokens=10, completion_tokens=5),
        degraded=True,
    )
    stored = result_summary(finished_result(finished, "trace"))
    ordinary = result_summary(end_result("r", "t", ExitReason.COMPLETED, "model.end_turn", ""))
    assert stored.keys() == ordinary.keys()
    assert "type" not in stored
    assert stored["trace_id"] == "trace"
    assert stored["hint"] == "as published"
    assert finished_message(finished_result(finished, "trace")) == finished
