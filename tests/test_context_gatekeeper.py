"""The context gatekeeper on a real bus, with a stand-in conductor that keeps a transcript
and carries out what the gatekeeper asks (as the real one does)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from actors.context import (
    Calibration,
    ContextPolicy,
    Estimator,
    TextCounter,
    apply_folds,
    summary_message,
)
from actors.context.gatekeeper import ContextGatekeeper
from bus import (
    Bus,
    ChatMessage,
    ContextAction,
    ExitReason,
    Inbox,
    Message,
    ModelReplied,
    ModelRequest,
    Outcome,
    PromptRejected,
    RunFinished,
    StopSignal,
    ToolCall,
    ToolSpec,
    TurnStarted,
    Usage,
)
from tests.harness import drain, serving
from tests.pairing import pairing_problems
from tests.started import run_started

TOOLS = (ToolSpec(name="read", description="Read a file.", parameters='{"type":"object"}'),)


def chars(text: str) -> int:
    """A stand-in tokenizer: one token per character (easy to reason about)."""
    return len(text)


class Spy:
    def __init__(self) -> None:
        self.texts: list[str] = []

    def __call__(self, text: str) -> int:
        self.texts.append(text)
        return len(text)


@asynccontextmanager
async def gatekeeper(
    policy: ContextPolicy | None, *, counter: TextCounter = chars
) -> AsyncIterator[tuple[Bus, ContextGatekeeper]]:
    bus = Bus()
    keeper = ContextGatekeeper(
        bus,
        lambda run_id: policy,
        counter=counter,
        calibration=Calibration(),
    )
    async with serving(bus, keeper):
        yield bus, keeper


class Conductor:
    """The conductor's side of the protocol for one run, without the model and tools."""

    def __init__(self, bus: Bus, inbox: Inbox, *, model: str = "gpt-4o") -> None:
        self.bus, self.inbox, self.model = bus, inbox, model
        self.run_id = inbox.run_id
        self.transcript = [ChatMessage(role="user", content="Summarise the files.")]
        self.seen = 0
        self.turn = 0
        self.requests: list[ModelRequest] = []
        self.counting: list[str] = []

    def appended(self) -> tuple[ChatMessage, ...]:
        new = tuple(self.transcript[self.seen :])
        self.seen = len(self.transcript)
        return new

    def drain(self) -> list[Message]:
        """The gatekeeper's answers, folds applied; ``counting`` notes go to ``counting``."""
        answers = []
        for msg in drain(self.inbox):
            if isinstance(msg, ContextAction) and msg.kind == "counting":
                self.counting.append(msg.detail)
                continue
            if isinstance(msg, ContextAction) and msg.kind == "collapse":
                assert apply_folds(self.transcript, msg.folds) == []
            answers.append(msg)
        return answers

    async def start(self) -> None:
        await self.bus.publish_settled(
            run_started(
                run_id=self.run_id, trace_id="t", task="x", model=self.model, tool_specs=TOOLS
            )
        )

    async def begin_turn(self) -> list[Message]:
        self.turn += 1
        await self.bus.publish_settled(
            TurnStarted(
                run_id=self.run_id,
                turn=self.turn,
                stage="agent",
                prompt_messages=len(self.transcript),
                appended=self.appended(),
            )
        )
        return self.drain()

    async def send(self, *, purpose: str = "turn") -> None:
        request = ModelRequest(
            run_id=self.run_id,
            turn=self.turn,
            model=self.model,
            messages=tuple(self.transcript),
            tools=TOOLS,
        )
        self.requests.append(request)
        await self.bus.publish(request)

    async def reply(self, usage: Usage | None = None) -> list[Message]:
        await self.bus.publish_settled(
            ModelReplied(
                run_id=self.run_id,
                turn=self.turn,
                text_chars=0,
                tool_calls=1,
                finish_reason="tool_calls",
                usage=usage or Usage(prompt_tokens=0, estimated=True),
                total_usage=Usage(),
            )
        )
        return self.drain()

    def act(self, result_chars: int) -> None:
        call = ToolCall(id=f"call_{self.turn}", name="read", arguments='{"path": "f"}')
        self.transcript.append(
            ChatMessage(role="assistant", content=f"reading {self.turn}", tool_calls=(call,))
        )
        self.transcript.append(
            ChatMessage(role="tool", tool_call_id=call.id, content="r" * result_chars)
        )

    async def full_turn(self, result_chars: int, usage: Usage | None = None) -> list[Message]:
        answers = await self.begin_turn()
        if any(isinstance(a, StopSignal) for a in answers):
            return answers
        await self.send()
        answers += await self.reply(usage)
        self.act(result_chars)
        return answers

    async def rejected(self, attempt: int, message: str = "too long") -> list[Message]:
        await self.bus.publish_settled(
            PromptRejected(
                run_id=self.run_id,
                turn=self.turn,
                attempt=attempt,
                prompt_messages=len(self.transcript),
                appended=self.appended(),
                status=400,
                message=message,
            )
        )
        return self.drain()


def kinds(answers: list[Message]) -> list[str]:
    return [msg.kind if isinstance(msg, ContextAction) else type(msg).__name__ for msg in answers]


def recount(conductor: Conductor) -> int:
    estimator = Estimator("gpt-4o", counter=chars)
    return (
        sum(estimator.message(m).tokens for m in conductor.transcript)
        + estimator.tools(TOOLS).tokens
    )


@pytest.mark.asyncio
async def test_a_prompt_over_the_limit_is_stopped_before_its_request() -> None:
    policy = ContextPolicy(window=9_000, safety_buffer=3_000, output_reserve=1_000, collapse_at=0)
    async with gatekeeper(policy) as (bus, keeper):
        with bus.open_inbox("r") as inbox:
            run = Conductor(bus, inbox)
            await run.start()
            for _ in range(4):  # the 4th turn's prompt holds 3 results: about 4,700 tokens
                assert await run.full_turn(1_500) == []
            answers = await run.begin_turn()  # 4 results: over the 5,000 limit
    assert kinds(answers) == ["blocked", "StopSignal"]
    blocked, stop = answers
    assert isinstance(blocked, ContextAction)
    assert isinstance(stop, StopSignal)
    assert (stop.reason, stop.cause) == (ExitReason.BLOCKING_LIMIT, "context.blocking_limit")
    assert blocked.limit_tokens == 5_000
    assert blocked.estimate_tokens == recount(run) > 5_000
    assert "No request was sent" in stop.detail
    assert "9,000-token window of 'gpt-4o'" in stop.detail
    assert keeper.statistics().blocked == 1


@pytest.mark.asyncio
async def test_each_message_is_counted_once_however_long_the_run() -> None:
    spy = Spy()
    policy = ContextPolicy(window=1_000_000, collapse_at=0)
    async with gatekeeper(policy, counter=spy) as (bus, keeper):
        with bus.open_inbox("r") as inbox:
            run = Conductor(bus, inbox)
            await run.start()
            per_turn: list[int] = []
            for _ in range(40):
                before = len(spy.texts)
                await run.full_turn(2_000)
                per_turn.append(len(spy.texts) - before)
            await run.begin_turn()
            estimate = keeper.estimate("r")
    # Turn 1 counts the task; every later turn counts only the previous turn's assistant
    # text, call name, arguments, tool-call id and result: five texts, never the transcript.
    assert per_turn[1:] == [5] * 39
    assert len(spy.texts) == len(TOOLS) * 3 + 1 + 5 * 40
    assert estimate == recount(run)


@pytest.mark.asyncio
async def test_reported_usage_calibrates_the_model_and_estimated_usage_does_not() -> None:
    policy = ContextPolicy(window=1_000_000, collapse_at=0)
    async with gatekeeper(policy) as (bus, keeper):
        with bus.open_inbox("r") as inbox:
            run = Conductor(bus, inbox)
            await run.start()
            await run.begin_turn()
            await run.send()
            sent = recount(run)
            await run.reply(Usage(prompt_tokens=sent * 3, estimated=True))
            assert keeper.calibration.samples("gpt-4o") == 0
            run.act(100)
            await run.begin_turn()
            await run.send()
            sent = recount(run)
            await run.reply(Usage(prompt_tokens=sent * 2))
            run.act(100)
            await run.begin_turn()
            calibrated = keeper.estimate("r")
    assert keeper.calibration.ratio("gpt-4o") == pytest.approx(2.0)
    assert calibrated == pytest.approx(recount(run) * 2, abs=1)


@pytest.mark.asyncio
async def test_a_prompt_cut_silently_is_flagged_and_the_run_goes_on() -> None:
    policy = ContextPolicy(window=1_000_000, collapse_at=0)
    async with gatekeeper(policy) as (bus, keeper):
        with bus.open_inbox("r") as inbox:
            run = Conductor(bus, inbox)
            await run.start()
            await run.full_turn(8_000)
            answers = await run.full_turn(100, Usage(prompt_tokens=2_048))
    assert kinds(answers) == ["silent_truncation"]
    flag = answers[0]
    assert isinstance(flag, ContextAction)
    assert flag.reported_tokens == 2_048
    assert flag.estimate_tokens > 8_000
    assert "without an error" in flag.detail
    assert keeper.calibration.samples("gpt-4o") == 0  # a cut prompt teaches nothing
    assert keeper.statistics().silent_truncations == 1


@pytest.mark.asyncio
async def test_near_the_limit_old_results_are_folded_and_pairing_stays_valid() -> None:
    policy = ContextPolicy(window=20_000, safety_buffer=3_000, collapse_at=0.5, collapse_to=0.3)
    async with gatekeeper(policy) as (bus, _):
        with bus.open_inbox("r") as inbox:
            run = Conductor(bus, inbox)
            await run.start()
            collapses: list[ContextAction] = []
            for _ in range(12):
                answers = await run.full_turn(2_500)
                assert not any(isinstance(a, StopSignal) for a in answers)
                collapses += [a for a in answers if isinstance(a, ContextAction)]
                assert pairing_problems(run.transcript) == []
    assert collapses
    assert all(action.kind == "collapse" and not action.reactive for action in collapses)
    assert all(action.after_tokens <= 0.3 * 17_000 for action in collapses)
    folded = [m for m in run.transcript if (m.content or "").startswith("[folded: read result")]
    assert folded
    # The newest result (not yet answered by the model) is never folded.
    assert run.transcript[-1].content == "r" * 2_500
    for request in run.requests:
        assert pairing_problems(request.messages) == []


@pytest.mark.asyncio
async def test_a_refused_prompt_is_collapsed_then_compacted_then_stopped() -> None:
    policy = ContextPolicy(window=1_000_000, collapse_at=0, keep_recent_turns=1)
    async with gatekeeper(policy) as (bus, keeper):
        with bus.open_inbox("r") as inbox:
            run = Conductor(bus, inbox)
            await run.start()
            for _ in range(4):
                await run.full_turn(3_000)
            await run.begin_turn()
            await run.send()
            first = await run.rejected(1)
            assert kinds(first) == ["collapse"]
            assert first[0].reactive  # type: ignore[attr-defined]
            await run.send()  # the retry
            second = await run.rejected(2)
            assert kinds(second) == ["compact"]
            compact = second[0]
            assert isinstance(compact, ContextAction)
            # The conductor asks the model, then puts the summary in place of the span.
            await run.bus.publish(
                ModelRequest(
                    run_id="r", turn=run.turn, model="gpt-4o", messages=(), purpose="compact"
                )
            )
            summary = summary_message("they read 3 files", compact.first_turn, compact.last_turn)
            run.transcript[compact.start : compact.end] = [summary]
            run.seen -= compact.end - compact.start - 1
            assert pairing_problems(run.transcript) == []
            await run.send()  # the retry after compaction
            third = await run.rejected(3, "This model's maximum context length is 4096 tokens.")
            estimate = keeper.estimate("r")
    assert (compact.first_turn, compact.last_turn, compact.start) == (1, 3, 1)
    assert compact.history_chars > 0
    assert compact.summary_max_tokens == policy.summary_max_tokens
    assert kinds(third) == ["StopSignal"]
    stop = third[0]
    assert isinstance(stop, StopSignal)
    assert (stop.reason, stop.cause) == (ExitReason.PROMPT_TOO_LONG, "context.prompt_too_long")
    assert "3 time(s), after collapsing and compacting" in stop.detail
    assert estimate == recount(run)  # the ledger followed the compaction exactly
    assert keeper.statistics().resyncs == 0


@pytest.mark.asyncio
async def test_with_nothing_to_fold_or_compact_a_refusal_stops_at_once() -> None:
    async with gatekeeper(ContextPolicy(window=1_000_000)) as (bus, _):
        with bus.open_inbox("r") as inbox:
            run = Conductor(bus, inbox)
            await run.start()
            await run.begin_turn()
            await run.send()
            answers = await run.rejected(1, "Request entity too large.")
    assert kinds(answers) == ["StopSignal"]
    assert "with nothing to fold or compact" in answers[0].detail  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_a_window_named_by_a_refusal_is_learned_for_later_turns() -> None:
    # The 6,000-character result takes 85 % of the learned room: not cut at a share of 1.
    policy = ContextPolicy(
        window=128_000, safety_buffer=1_000, collapse_at=0, tool_result_share=1.0
    )
    async with gatekeeper(policy) as (bus, keeper):
        with bus.open_inbox("r") as inbox:
            run = Conductor(bus, inbox)
            await run.start()
            await run.full_turn(3_000)
            await run.full_turn(3_000)
            await run.begin_turn()
            await run.send()
            answers = await run.rejected(1, "This model's maximum context length is 8,192 tokens.")
            assert kinds(answers) == ["collapse"]
            await run.send()
            await run.reply()
            run.act(6_000)
            later = await run.begin_turn()
    assert kinds(later) == ["blocked", "StopSignal"]
    assert later[0].limit_tokens == 8_192 - 1_000  # type: ignore[attr-defined]
    assert keeper.statistics().collapses == 1


@pytest.mark.asyncio
async def test_a_transcript_out_of_step_is_counted_afresh_at_the_next_request() -> None:
    async with gatekeeper(ContextPolicy(window=1_000_000)) as (bus, keeper):
        with bus.open_inbox("r") as inbox:
            run = Conductor(bus, inbox)
            await run.start()
            await run.full_turn(100)
            run.seen = len(run.transcript) + 1  # lose track: the next report skips a message
            run.act(100)
            assert await run.begin_turn() == []
            await run.send()
            await run.reply()
            run.act(100)
            await run.begin_turn()
            estimate = keeper.estimate("r")
    assert keeper.statistics().resyncs == 1
    assert estimate == recount(run)


@pytest.mark.asyncio
async def test_runs_without_a_policy_are_not_watched_and_state_ends_with_the_run() -> None:
    async with gatekeeper(None) as (bus, keeper):
        with bus.open_inbox("r") as inbox:
            run = Conductor(bus, inbox)
            await run.start()
            assert await run.full_turn(10_000_000) == []
            assert keeper.estimate("r") is None
    async with gatekeeper(ContextPolicy(window=100_000)) as (bus, keeper):
        with bus.open_inbox("r") as inbox:
            run = Conductor(bus, inbox)
            await run.start()
            await run.full_turn(10)
            assert keeper.statistics().runs == 1
            counted = keeper.statistics().texts_counted
            await bus.publish_settled(
                RunFinished(
                    run_id="r",
                    exit_reason=ExitReason.COMPLETED,
                    cause="model.end_turn",
                    outcome=Outcome.DONE,
                    detail="",
                    hint="",
                    turns=1,
                    llm_requests=1,
                    tool_calls=0,
                    usage=Usage(),
                )
            )
            assert keeper.statistics().runs == 0
            assert keeper.statistics().texts_counted == counted


async def measure_turn_cost(model: str, turns: int = 200, size: int = 7_000) -> None:
    """Print the check's cost per turn with the real tokenizer, early and late in a long run,
    next to one re-count of the whole transcript."""
    import time

    from actors.context import bpe_counter

    text = ("The team recorded every deviation in the shared notebook. " * 200)[:size]
    estimator = Estimator(model)
    policy = ContextPolicy(window=10_000_000, collapse_at=0)
    async with gatekeeper(policy, counter=bpe_counter(estimator.encoding)) as (bus, keeper):
        with bus.open_inbox("r") as inbox:
            run = Conductor(bus, inbox, model=model)
            await run.start()
            costs: list[float] = []
            for _ in range(turns):
                started = time.perf_counter()
                await run.begin_turn()
                costs.append(time.perf_counter() - started)
                await run.send()
                await run.reply()
                run.transcript.append(ChatMessage(role="assistant", content="ok"))
                run.transcript.append(ChatMessage(role="user", content=text))
            estimate = keeper.estimate("r") or 0
    started = time.perf_counter()
    sum(estimator.message(message).tokens for message in run.transcript)
    recount_ms = (time.perf_counter() - started) * 1e3
    early, late = sorted(costs[:21])[10] * 1e3, sorted(costs[-21:])[10] * 1e3
    print(
        f"{model}: {turns} turns of +{size:,} chars (prompt ~{estimate:,} tokens): check per "
        f"turn {early:.2f} ms (turns 1-21), {late:.2f} ms (last 21); one re-count of the "
        f"whole transcript {recount_ms:.1f} ms"
    )


if __name__ == "__main__":  # python -m tests.test_context_gatekeeper
    for name in ("gpt-4o", "qwen2.5:7b"):
        anyio.run(measure_turn_cost, name)


@pytest.mark.asyncio
async def test_the_cut_bound_is_worked_out_again_after_a_window_is_reported() -> None:
    """A reported window resets the bound under which results need no cut; the next turn
    works it out again (for the same window too), so later turns keep the quick test."""
    policy = ContextPolicy(window=50_000, safety_buffer=3_000, output_reserve=1_000)
    async with gatekeeper(policy) as (bus, keeper):
        with bus.open_inbox("r") as inbox:
            run = Conductor(bus, inbox)
            await run.start()
            await run.full_turn(100)
            assert await run.full_turn(100) == []
            bound = keeper._runs["r"].cut_chars
            assert bound > 100  # the results need no cut, by one comparison
            keeper._window_reported(run.model, 50_000)  # a server's probe, the same window
            assert await run.full_turn(100) == []
            assert keeper._runs["r"].cut_chars == bound
