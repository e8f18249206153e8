"""Tool results bounded by the model's window (issue #19): a result the model has not
answered yet, larger than ``tool_result_share`` of the room the fixed prompt leaves, is cut
with a note on how to read the rest, so the next request goes out instead of stopping at
``blocking_limit``. Also: model windows by full id, and the unknown-window warning."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from actors.context import (
    Calibration,
    ContextPolicy,
    Estimator,
    apply_folds,
    match_model,
    warn_default_window,
    window_for,
)
from actors.context.cutting import CUT_MARKER
from actors.context.gatekeeper import ContextGatekeeper
from bus import (
    Bus,
    ChatMessage,
    ContextAction,
    Message,
    ModelRequest,
    StopSignal,
    ToolCall,
    ToolSpec,
    TurnStarted,
)
from tests.harness import drain, serving
from tests.started import run_started

TOOLS = (
    ToolSpec(
        name="read_file",
        description="Read lines of a file.",
        parameters='{"type":"object","properties":{"path":{"type":"string"},'
        '"offset":{"type":"integer"},"limit":{"type":"integer"}}}',
    ),
)
MODEL = "models/tiny.gguf"  # an unknown tokenizer: the byte bound counts until calibrated
LINE = "row {n:06d}: sample=0x3fa9 temperature=21.5C status=ok note=plain text here\n"


def big_text(chars: int) -> str:
    lines = [LINE.format(n=n) for n in range(chars // len(LINE.format(n=0)) + 1)]
    return "".join(lines)[:chars]


@asynccontextmanager
async def keeper(policy: ContextPolicy) -> AsyncIterator[tuple[Bus, ContextGatekeeper]]:
    bus = Bus()
    gatekeeper = ContextGatekeeper(bus, lambda run_id: policy, calibration=Calibration())
    async with serving(bus, gatekeeper):
        yield bus, gatekeeper


class Run:
    def __init__(self, bus: Bus, inbox: object) -> None:
        self.bus, self.inbox = bus, inbox
        self.transcript = [ChatMessage(role="user", content="Read data.csv and summarise it.")]
        self.seen = 0
        self.turn = 0
        self.counting: list[str] = []

    async def start(self) -> None:
        await self.bus.publish_settled(
            run_started(run_id="r", trace_id="t", task="x", model=MODEL, tool_specs=TOOLS)
        )

    async def turn_started(self) -> list[Message]:
        self.turn += 1
        appended = tuple(self.transcript[self.seen :])
        self.seen = len(self.transcript)
        await self.bus.publish_settled(
            TurnStarted(
                run_id="r",
                turn=self.turn,
                stage="agent",
                prompt_messages=len(self.transcript),
                appended=appended,
            )
        )
        answers = []
        for msg in drain(self.inbox):  # type: ignore[arg-type]
            if isinstance(msg, ContextAction) and msg.kind == "counting":
                self.counting.append(msg.detail)
                continue
            if isinstance(msg, ContextAction) and msg.kind == "collapse":
                assert apply_folds(self.transcript, msg.folds) == []
            answers.append(msg)
        return answers

    async def send(self) -> None:
        request = ModelRequest(
            run_id="r", turn=self.turn, model=MODEL, messages=tuple(self.transcript), tools=TOOLS
        )
        await self.bus.publish(request)

    def read(self, result: str, arguments: str = '{"path": "data.csv"}') -> None:
        call = ToolCall(id=f"call_{self.turn}", name="read_file", arguments=arguments)
        self.transcript.append(ChatMessage(role="assistant", content="", tool_calls=(call,)))
        self.transcript.append(ChatMessage(role="tool", tool_call_id=call.id, content=result))


POLICY = ContextPolicy(window=32_768, output_reserve=8_192)  # limit 21,576


@pytest.mark.asyncio
async def test_a_result_larger_than_the_window_is_cut_and_the_next_request_goes_out() -> None:
    async with keeper(POLICY) as (bus, gatekeeper):
        with bus.open_inbox("r") as inbox:
            run = Run(bus, inbox)
            await run.start()
            assert await run.turn_started() == []
            await run.send()
            run.read(big_text(100_000))  # the executor's cut: 100,000 characters
            answers = await run.turn_started()
            after = gatekeeper.estimate("r")
    assert [type(a).__name__ for a in answers] == ["ContextAction"]  # no stop
    [cut] = answers
    assert isinstance(cut, ContextAction)
    assert cut.kind == "collapse"
    assert not cut.reactive
    assert cut.detail.startswith("Cut the result of read_file (1 result(s)) to ")
    [fold] = cut.folds
    content = run.transcript[fold.index].content or ""
    assert content.startswith(LINE.format(n=0))
    assert CUT_MARKER in content
    assert "of 100,000 characters are shown" in content
    assert "call read_file again with offset=" in content
    assert after is not None
    assert cut.estimate_tokens > POLICY.limit  # uncut, the next request would have been blocked
    assert after == cut.after_tokens <= POLICY.limit
    kept = content.split("\n[result cut")[0]
    assert kept.endswith("\n")  # whole lines
    assert f"offset={kept.count(chr(10))} " in content  # the line after the last one shown


@pytest.mark.asyncio
async def test_a_cut_read_file_result_names_the_offset_that_reads_on() -> None:
    async with keeper(POLICY) as (bus, _):
        with bus.open_inbox("r") as inbox:
            run = Run(bus, inbox)
            await run.start()
            await run.turn_started()
            await run.send()
            run.read(big_text(60_000), '{"path": "data.csv", "offset": 500}')
            [cut] = await run.turn_started()
    assert isinstance(cut, ContextAction)
    content = run.transcript[cut.folds[0].index].content or ""
    shown = content.split("\n[result cut")[0].count("\n")
    assert f"call read_file again with offset={500 + shown} and a limit" in content


@pytest.mark.asyncio
async def test_a_result_within_its_share_is_left_whole() -> None:
    async with keeper(POLICY) as (bus, _):
        with bus.open_inbox("r") as inbox:
            run = Run(bus, inbox)
            await run.start()
            await run.turn_started()
            await run.send()
            run.read(big_text(4_000))  # about 4,000 tokens at most: under half of 21k
            assert await run.turn_started() == []
    assert run.transcript[-1].content == big_text(4_000)


@pytest.mark.asyncio
async def test_with_the_share_at_zero_nothing_is_cut_and_the_turn_is_blocked() -> None:
    off = ContextPolicy(window=32_768, output_reserve=8_192, tool_result_share=0)
    async with keeper(off) as (bus, _):
        with bus.open_inbox("r") as inbox:
            run = Run(bus, inbox)
            await run.start()
            await run.turn_started()
            await run.send()
            run.read(big_text(100_000))
            answers = await run.turn_started()
    assert [a.kind if isinstance(a, ContextAction) else "stop" for a in answers] == [
        "blocked",
        "stop",
    ]
    assert isinstance(answers[1], StopSignal)


@pytest.mark.asyncio
async def test_several_results_of_one_reply_each_fit_their_share() -> None:
    async with keeper(POLICY) as (bus, gatekeeper):
        with bus.open_inbox("r") as inbox:
            run = Run(bus, inbox)
            await run.start()
            await run.turn_started()
            await run.send()
            calls = tuple(
                ToolCall(id=f"c{i}", name="read_file", arguments=f'{{"path": "{i}.csv"}}')
                for i in range(2)
            )
            run.transcript.append(ChatMessage(role="assistant", content="", tool_calls=calls))
            for call in calls:
                run.transcript.append(
                    ChatMessage(role="tool", tool_call_id=call.id, content=big_text(50_000))
                )
            [cut] = await run.turn_started()
            after = gatekeeper.estimate("r")
    assert isinstance(cut, ContextAction)
    assert len(cut.folds) == 2
    # Each took at most half of the room; collapse folds the rest once they are answered.
    assert after is not None
    assert after <= POLICY.limit


async def _one_reply(run: Run, sizes: list[int]) -> list[Message]:
    await run.start()
    await run.turn_started()
    await run.send()
    calls = tuple(
        ToolCall(id=f"c{i}", name="read_file", arguments=f'{{"path": "{i}.csv"}}')
        for i in range(len(sizes))
    )
    run.transcript.append(ChatMessage(role="assistant", content="", tool_calls=calls))
    for call, size in zip(calls, sizes, strict=True):
        run.transcript.append(
            ChatMessage(role="tool", tool_call_id=call.id, content=big_text(size))
        )
    return await run.turn_started()


@pytest.mark.asyncio
async def test_the_share_is_for_the_turn_s_results_together() -> None:
    # issue #32: three results, each within the share (8,000 of ~10,700 tokens), together
    # over the limit: they ended the run blocking_limit; now they are cut to fit the share
    async with keeper(POLICY) as (bus, gatekeeper):
        with bus.open_inbox("r") as inbox:
            run = Run(bus, inbox)
            answers = await _one_reply(run, [8_000, 8_000, 8_000])
            after = gatekeeper.estimate("r")
    assert [a.kind if isinstance(a, ContextAction) else "stop" for a in answers] == ["collapse"]
    [cut] = answers
    assert isinstance(cut, ContextAction)
    assert len(cut.folds) == 3
    assert "of 3 results together" in cut.detail
    assert after is not None
    assert after <= POLICY.limit
    contents = [run.transcript[fold.index].content or "" for fold in cut.folds]
    assert all(CUT_MARKER in c and "call read_file again with offset=" in c for c in contents)
    # shared evenly: each keeps about a third of the share (half of the room)
    assert sum(len(c) for c in contents) < 0.5 * POLICY.limit * 1.05


@pytest.mark.asyncio
async def test_a_small_result_keeps_all_of_it_and_the_large_one_takes_the_rest() -> None:
    async with keeper(POLICY) as (bus, _):
        with bus.open_inbox("r") as inbox:
            run = Run(bus, inbox)
            answers = await _one_reply(run, [2_000, 30_000])
    [cut] = answers
    assert isinstance(cut, ContextAction)
    [fold] = cut.folds  # the small one is whole
    assert CUT_MARKER in (run.transcript[fold.index].content or "")
    assert run.transcript[-2].content == big_text(2_000)


@pytest.mark.asyncio
async def test_results_within_the_share_together_are_left_whole() -> None:
    async with keeper(POLICY) as (bus, _):
        with bus.open_inbox("r") as inbox:
            run = Run(bus, inbox)
            assert await _one_reply(run, [3_000, 3_000, 3_000]) == []
    assert [m.content for m in run.transcript[-3:]] == [big_text(3_000)] * 3


@pytest.mark.asyncio
async def test_an_uncalibrated_bound_over_the_limit_lets_the_first_request_out_only() -> None:
    # 4,000 characters of prose: a bound of ~4,000 tokens, a typical estimate of ~800.
    small = ContextPolicy(window=6_000, safety_buffer=1_000, output_reserve=2_000)  # 3,000
    async with keeper(small) as (bus, _):
        with bus.open_inbox("r") as inbox:
            run = Run(bus, inbox)
            run.transcript[0] = ChatMessage(role="user", content=PROSE[:4_000])
            await run.start()
            assert await run.turn_started() == []  # sent: the server's answer decides
            await run.send()
            run.read("short result")  # the reply reported no usage: nothing calibrated
            second = await run.turn_started()
    assert run.counting[0].startswith("Prompt tokens of 'models/tiny.gguf' are bounded by")
    assert "the request is sent and the server's answer decides" in run.counting[1]
    assert [a.kind if isinstance(a, ContextAction) else "stop" for a in second] == [
        "blocked",
        "stop",
    ]
    blocked = second[0]
    assert isinstance(blocked, ContextAction)
    assert "The estimate is an upper bound (UTF-8 bytes)" in blocked.detail


PROSE = (
    "The team followed the standard operating procedure and recorded every deviation in "
    "the shared notebook, so the comparison between strains stays fair. "
) * 40


# ------------------------------------------------------------------ windows


def test_a_window_key_matches_the_full_model_id_and_its_last_part() -> None:
    windows = {"models/tiny.gguf": 512, "llama-3.1-8b": 131_072}
    assert match_model("models/tiny.gguf", windows) == 512
    assert match_model("Models/Tiny.gguf", windows) == 512
    assert match_model("meta-llama/Llama-3.1-8B-Instruct", windows) == 131_072
    assert match_model("tiny.gguf", windows) is None  # the key names the full id
    assert match_model("other/tiny.gguf", {"tiny.gguf": 1_024}) == 1_024  # the basename
    assert window_for("models/tiny.gguf", windows) == 512


def test_an_unknown_window_is_warned_about_once_per_model(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="loopfuse.context"):
        warn_default_window("models/unknown-a.gguf", 32_768)
        warn_default_window("models/unknown-a.gguf", 32_768)
        warn_default_window("models/unknown-b.gguf", 32_768)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "the context window of model 'models/unknown-a.gguf' is unknown: assuming 32,768 "
        'tokens (set [context.windows] "models/unknown-a.gguf" = N; a server that reports '
        "max_model_len, as vLLM does, replaces this at the first run)",
        "the context window of model 'models/unknown-b.gguf' is unknown: assuming 32,768 "
        'tokens (set [context.windows] "models/unknown-b.gguf" = N; a server that reports '
        "max_model_len, as vLLM does, replaces this at the first run)",
    ]


def test_the_bound_is_never_below_a_byte_tokenizers_count() -> None:
    # A tokenizer with one token per byte (the worst a byte-fallback BPE can do) and one for
    # a SentencePiece prefix: the bound of any text is at least that.
    estimator = Estimator(MODEL)
    for text in ("Say hello", "Zürich — 東京", "0123456789" * 50, big_text(3_000), "🙂" * 7):
        assert estimator.text(text).bound >= len(text.encode()) + 1
        message = ChatMessage(role="user", content=text)
        assert estimator.message(message).bound >= len(text.encode()) + 1 + 14
