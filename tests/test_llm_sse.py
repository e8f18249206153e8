"""The LLM caller's own stream reading: the SSE decoder, the msgspec chunk decoder, the raw
response reader, and the caller on a loopback server.

The byte-exact edges (reads split mid-line, mid-CRLF, mid-JSON; a transport failure after
some chunks) go through a response that hands over each piece as one read and raises the
connection pool's errors where told; the caller itself is driven over real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

import aiohttp
import anyio
import httpx2
import msgspec
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.llm.accumulator import ReplyAccumulator
from actors.llm.caller import LLMCaller
from actors.llm.chunks import Chunk, decode_chunk, decode_completion, error_frame
from actors.llm.errors import classify
from actors.llm.settings import EndpointSettings
from actors.llm.sse import MAX_LINE_BYTES, SSEDecoder
from actors.llm.stream import ChunkReader, StreamTally, read_chunks
from bus import Bus, ChatMessage, Message, ModelError, ModelReply, ModelRequest, ModelTextDelta
from tests.loopback import open_loopback

WAIT = 10.0


def frame(payload: dict[str, Any] | str, eol: str = "\n") -> bytes:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {text}{eol}{eol}".encode()


def text_chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "x",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    }


USAGE = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}


def feed_all(reads: list[bytes]) -> list[bytes]:
    decoder = SSEDecoder()
    return [payload for data in reads for payload in decoder.feed(data)]


# --------------------------------------------------------------------------- SSE decoder


def test_line_endings_lf_crlf_and_cr_alike() -> None:
    for eol in ("\n", "\r\n", "\r"):
        stream = frame({"a": 1}, eol) + frame({"b": 2}, eol)
        assert feed_all([stream]) == [b'{"a": 1}', b'{"b": 2}'], repr(eol)


def test_a_crlf_split_between_two_reads_ends_one_line() -> None:
    # "\r" closes the line; the "\n" that starts the next read must not be a blank line
    # (that would end an event early) nor part of the next line.
    assert feed_all([b"data: 1\r", b"\ndata: 2\r", b"\n\r", b"\n"]) == [b"1\n2"]


def test_comments_blank_lines_and_other_fields_are_ignored() -> None:
    stream = b": keep-alive\n\n\n: ping\nevent: delta\nid: 7\nretry: 10\ndata: {}\n\n"
    assert feed_all([stream]) == [b"{}"]


def test_multi_line_data_is_joined_with_lf() -> None:
    stream = b'data: {"a":\ndata:1,\ndata\ndata: "b": 2}\n\n'
    payloads = feed_all([stream])
    assert payloads == [b'{"a":\n1,\n\n"b": 2}']
    assert msgspec.json.decode(payloads[0]) == {"a": 1, "b": 2}


def test_only_one_space_after_the_colon_is_dropped() -> None:
    assert feed_all([b"data:x\n\ndata:  y\n\n"]) == [b"x", b" y"]


def test_events_without_data_and_an_unfinished_event_are_not_dispatched() -> None:
    # The WHATWG rules: no data line, no event; pending data at the end is discarded.
    assert feed_all([b"id: 1\n\nevent: x\n\n", b"data: cut"]) == []
    assert feed_all([b"data: a\n\n\n\n", b"data: b\n"]) == [b"a"]


def test_a_long_line_over_many_reads() -> None:
    payload = json.dumps(text_chunk("x" * 5000)).encode()
    reads = [b"data: "] + [payload[i : i + 7] for i in range(0, len(payload), 7)] + [b"\n\n"]
    assert feed_all(reads) == [payload]


STREAM = (
    b": keep-alive\r\n\r\n"
    + frame(text_chunk("Hel"), "\r\n")
    + b'data: {"choices": [{"delta":\ndata: {"content": "lo"}}]}\n\n'
    + frame(text_chunk("!", "stop"), "\r")
    + b": ping\n\n"
    + frame(USAGE)
    + b"data: [DONE]\n\n"
)


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split_into_reads_gives_the_same_events(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(STREAM)]
    reads = [STREAM[a:b] for a, b in itertools.pairwise(bounds)]
    assert feed_all(reads) == feed_all([STREAM])
    assert len(feed_all([STREAM])) == 5


SSE_PIECES = st.sampled_from(
    [
        b"data: {}\n\n",
        b'data: {"a": 1}\n\n',
        b"data:  two spaces\n\n",
        b"data: [DONE]\n\n",
        b"data: crlf\r\n\r\n",
        b"data: cr\r\r",
        b"data:x\n\n",
        b"data\n\n",
        b": keep-alive\n\n",
        b"event: m\ndata: y\n\n",
        b"data: a\ndata: b\n\n",
        b"id: 7\n",
        b"\n",
        b"data: open",
    ]
)


@given(
    st.lists(SSE_PIECES, max_size=12),
    st.lists(st.integers(min_value=0, max_value=200), max_size=6),
)
def test_whole_event_reads_give_what_the_line_by_line_decoder_gives(
    pieces: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(pieces)
    bounds = [0, *sorted(min(cut, len(stream)) for cut in cuts), len(stream)]
    reads = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    one_byte_reads = [stream[i : i + 1] for i in range(len(stream))]  # never a whole event
    assert feed_all(reads) == feed_all([stream]) == feed_all(one_byte_reads)


def test_a_read_of_whole_data_events_is_split_at_once() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a": 1}\n\ndata:  b\n\ndata: [DONE]\n\n') == [
        b'{"a": 1}',
        b" b",
        b"[DONE]",
    ]
    assert decoder.feed(b"data: x\n\n: ping\n\n") == [b"x"]  # a comment: line by line
    assert decoder.feed(b"data: y\n") == []
    assert decoder.feed(b"\ndata: z\n\n") == [b"y", b"z"]  # an event left open first


# --------------------------------------------------------------------------- chunk decoder


def test_a_chunk_decodes_the_fields_the_accumulator_reads() -> None:
    raw = {
        "id": "x",
        "obfuscation": "pad",
        "choices": [
            {
                "index": 0,
                "logprobs": None,
                "delta": {
                    "role": "assistant",
                    "reasoning_content": "hm",
                    "content": "hi",
                    "tool_calls": [
                        {"index": 0, "id": "c1", "type": "function", "function": {"name": "f"}}
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    }
    chunk = decode_chunk(json.dumps(raw).encode())
    assert isinstance(chunk, Chunk)
    assert chunk.choices is not None
    (choice,) = chunk.choices
    assert choice.delta is not None
    assert choice.delta.content == "hi"
    assert choice.finish_reason == "tool_calls"
    assert error_frame(chunk) is None
    acc = ReplyAccumulator()
    assert acc.feed_chunk(chunk) == "hi"
    assert [(c.id, c.name) for c in acc.assemble().tool_calls] == [("c1", "f")]
    assert (acc.usage and acc.usage.completion_tokens) == 2


@pytest.mark.parametrize(
    "raw",
    [
        {"choices": [], "usage": {"prompt_tokens": "many", "completion_tokens": 1}},
        {"choices": [{"index": 0, "delta": {"content": 5}}, "junk"]},
        {"choices": "none"},
        42,
        [1, 2],
    ],
)
def test_odd_chunks_are_read_leniently_not_rejected(raw: object) -> None:
    chunk = decode_chunk(json.dumps(raw).encode())
    acc = ReplyAccumulator()
    assert acc.feed_chunk(chunk) == ""
    assert (acc.usage, acc.finish_reason, acc.text) == (None, None, "")
    assert error_frame(chunk) is None


def test_an_odd_chunk_keeps_what_is_well_formed() -> None:
    raw = {"choices": [{"delta": {"content": "ok", "tool_calls": "?"}, "finish_reason": "stop"}]}
    acc = ReplyAccumulator()
    assert acc.feed_chunk(decode_chunk(json.dumps(raw).encode())) == "ok"
    assert acc.finish_reason == "stop"


def test_text_that_is_not_json_raises_a_decode_error() -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_chunk(b"{this is not json")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"error": {"message": "overloaded", "code": "x"}}, "overloaded"),
        ({"error": {"code": "x"}}, "An error occurred during streaming"),
        ({"error": "boom"}, "An error occurred during streaming"),
        ({"error": {"message": "odd"}, "choices": "junk"}, "odd"),  # the lenient path
    ],
)
def test_error_frames_as_the_sdk_reads_them(raw: dict[str, Any], expected: str) -> None:
    found = error_frame(decode_chunk(json.dumps(raw).encode()))
    assert found == (expected, raw["error"])


def test_no_error_frame_for_a_null_or_empty_error() -> None:
    assert error_frame(decode_chunk(b'{"error": null, "choices": []}')) is None
    assert error_frame(decode_chunk(b'{"error": {}}')) is None


def test_a_whole_completion() -> None:
    body = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "content": "hi",
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 1},
    }
    acc = ReplyAccumulator()
    assert acc.feed_completion(decode_completion(json.dumps(body).encode())) == "hi"
    assert [(c.id, c.name, c.arguments) for c in acc.assemble().tool_calls] == [("c", "f", "{}")]
    assert acc.finish_reason == "tool_calls"
    lenient = decode_completion(b'{"choices": [{"message": {"content": "x"}}], "usage": 1}')
    assert ReplyAccumulator().feed_completion(lenient) == "x"


# --------------------------------------------------------------------------- the reader


Reads = list[bytes | BaseException]


class Response:
    """A response whose body arrives as ``reads`` (an exception in the list is raised at
    that point, as the connection pool raises it)."""

    http_version = "HTTP/1.1"
    request = httpx2.Request("POST", "http://model.test/v1/chat/completions")

    def __init__(self, reads: Reads) -> None:
        self._reads = reads

    def drained_nowait(self) -> bool:
        return False  # the rest is read through aiter_bytes

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        for item in self._reads:
            if isinstance(item, BaseException):
                raise item
            yield item


@asynccontextmanager
async def open_response(reads: Reads) -> AsyncIterator[Response]:
    yield Response(reads)


async def read_all(reads: Reads) -> tuple[ReplyAccumulator, list[int]]:
    """The accumulator after the whole body, and the batch sizes seen."""
    acc = ReplyAccumulator()
    sizes: list[int] = []
    async with open_response(reads) as response, aclosing(read_chunks(response)) as batches:
        async for batch in batches:
            sizes.append(len(batch))
            for chunk in batch:
                acc.feed_chunk(chunk)
    return acc, sizes


@pytest.mark.asyncio
async def test_reads_split_anywhere_with_keep_alives_crlf_and_multi_line_data() -> None:
    with anyio.fail_after(WAIT):
        acc, sizes = await read_all(
            [STREAM[:3], STREAM[3:40], STREAM[40:41], STREAM[41:170], STREAM[170:]]
        )
    assert acc.text == "Hello!"
    assert acc.finish_reason == "stop"
    assert acc.usage is not None
    assert acc.usage.prompt_tokens == 3
    assert sum(sizes) == 4
    assert all(sizes)


@pytest.mark.asyncio
async def test_one_batch_per_read() -> None:
    one_read = frame(text_chunk("a")) + frame(text_chunk("b")) + frame(text_chunk("c", "stop"))
    with anyio.fail_after(WAIT):
        acc, sizes = await read_all([one_read, frame(USAGE), b"data: [DONE]\n\n"])
    assert (acc.text, sizes) == ("abc", [3, 1])


@pytest.mark.asyncio
async def test_done_ends_the_stream_and_anything_after_it_is_ignored() -> None:
    reads: Reads = [frame(text_chunk("a", "stop")) + b"data: [DONE]\n\n" + frame(text_chunk("b"))]
    reads.append(frame(text_chunk("c")))
    with anyio.fail_after(WAIT):
        acc, _ = await read_all(reads)
    assert acc.text == "a"


@pytest.mark.asyncio
async def test_a_stream_may_end_without_done() -> None:
    with anyio.fail_after(WAIT):
        acc, _ = await read_all([frame(text_chunk("a", "stop"))])
    assert (acc.text, acc.finish_reason) == ("a", "stop")


async def failure_after(reads: Reads) -> tuple[BaseException, str]:
    """The exception reading ``reads`` raises, and the text fed before it."""
    acc = ReplyAccumulator()
    with anyio.fail_after(WAIT):
        try:
            async with open_response(reads) as response, aclosing(read_chunks(response)) as it:
                async for batch in it:
                    for chunk in batch:
                        acc.feed_chunk(chunk)
        except Exception as exc:
            return exc, acc.text
    raise AssertionError("the stream was read without a failure")


@pytest.mark.asyncio
async def test_an_error_frame_raises_api_error_after_the_text_before_it() -> None:
    error = {"message": "This model's maximum context length is 8 tokens", "code": "x"}
    exc, text = await failure_after([frame(text_chunk("a")) + frame({"error": error})])
    assert type(exc) is openai.APIError
    assert exc.body == error
    assert exc.message == error["message"]
    assert text == "a"  # what came before the error frame, in the same read, counts
    assert classify(exc, streaming=True).kind == "context_length"


@pytest.mark.asyncio
async def test_a_payload_that_is_not_json_is_a_broken_stream() -> None:
    exc, text = await failure_after([frame(text_chunk("a")) + b"data: {not json\n\n"])
    assert isinstance(exc, msgspec.DecodeError)
    assert text == "a"
    failure = classify(exc, streaming=True)
    assert (failure.kind, failure.retryable) == ("stream", True)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("cause", "expected"),
    [
        (aiohttp.ClientOSError("reset"), openai.APIConnectionError),
        (aiohttp.ClientPayloadError("peer closed"), openai.APIConnectionError),
        (aiohttp.SocketTimeoutError("slow"), openai.APITimeoutError),
        (aiohttp.ServerDisconnectedError(), openai.APIConnectionError),
    ],
)
async def test_transport_failures_mid_stream_come_out_as_the_sdk_raises_them(
    cause: BaseException, expected: type[openai.APIError]
) -> None:
    exc, text = await failure_after([frame(text_chunk("a")), cause])
    assert type(exc) is expected
    assert exc.__cause__ is cause
    assert text == "a"
    assert classify(exc, streaming=True).kind == (
        "timeout" if expected is openai.APITimeoutError else "stream"
    )


@pytest.mark.asyncio
async def test_a_line_without_end_fails_the_stream_at_the_bound() -> None:
    piece = b"x" * (1 << 20)
    reads: Reads = [
        frame(text_chunk("a")),
        b"data: ",
        *[piece] * (MAX_LINE_BYTES // len(piece) + 1),
    ]
    exc, text = await failure_after(reads)
    assert type(exc) is openai.APIConnectionError
    assert "longer than" in str(exc.__cause__)
    assert text == "a"


class Closing(Response):
    """A response whose body iterator records that it was closed."""

    closed = False

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        async def reads() -> AsyncIterator[bytes]:
            try:
                for item in self._reads:
                    assert isinstance(item, bytes)
                    yield item
            finally:
                Closing.closed = True

        return reads()


Outcome = tuple[list[int], str, str | None, int, bool]


async def outcome(response: Response) -> Outcome:
    """Batch sizes, text, the failure (type and message), events and ``[DONE]`` of
    ``response`` read by a :class:`ChunkReader`."""
    acc = ReplyAccumulator()
    sizes: list[int] = []
    tally = StreamTally()
    reader = ChunkReader(response, tally)
    failure = None
    with anyio.fail_after(WAIT):
        try:
            while (batch := await reader.next_batch()) is not None:
                sizes.append(len(batch))
                for chunk in batch:
                    acc.feed_chunk(chunk)
            assert await reader.next_batch() is None  # ended stays ended
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
        finally:
            await reader.aclose()
    return sizes, acc.text, failure, tally.events, tally.done


READS: list[Reads] = [
    [STREAM[:3], STREAM[3:40], STREAM[40:41], STREAM[41:170], STREAM[170:]],
    [frame(text_chunk("a")) + frame(text_chunk("b")), frame(USAGE), b"data: [DONE]\n\n"],
    [frame(text_chunk("a", "stop")) + b"data: [DONE]\n\n" + frame(text_chunk("b"))],
    [b"data: [DONE]\n\n"],
    [frame(text_chunk("a", "stop"))],
    [b": keep-alive\n\n", b"", frame(text_chunk("a"))],
    [],
    [frame(text_chunk("a")) + frame({"error": {"message": "overloaded"}}), frame(USAGE)],
    [frame({"error": {"message": "at once"}})],
    [frame(text_chunk("a")) + b"data: {not json\n\n"],
    [frame(text_chunk("a")), aiohttp.ClientOSError("reset")],
    [aiohttp.SocketTimeoutError("slow")],
]


@pytest.mark.asyncio
@pytest.mark.parametrize("reads", READS)
async def test_read_chunks_reads_exactly_as_the_chunk_reader(reads: Reads) -> None:
    through_iterator = await outcome(Response(reads))
    async with open_response(reads) as response, aclosing(read_chunks(response)) as batches:
        sizes: list[int] = []
        with contextlib.suppress(Exception):
            async for batch in batches:
                sizes.append(len(batch))
    assert sizes == through_iterator[0]  # read_chunks is the same reader


@pytest.mark.asyncio
async def test_the_reader_closes_the_body_iterator_when_closed_early() -> None:
    Closing.closed = False
    reader = ChunkReader(Closing([frame(text_chunk("a")), frame(text_chunk("b"))]))
    with anyio.fail_after(WAIT):
        assert await reader.next_batch() is not None
        await reader.aclose()
    assert Closing.closed
    assert await reader.next_batch() is None


# --------------------------------------------------------------------------- the caller


class Pieces:
    """A raw ASGI app answering every request with the next list of byte pieces, each sent
    as its own body message (so, mostly, its own TCP segment)."""

    def __init__(self, *answers: list[bytes]) -> None:
        self.answers = list(answers)
        self.requests = 0
        self.seen: list[tuple[dict[str, str], bytes]] = []  # headers and body of each request

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        sent = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        self.seen.append((sent, body))
        pieces = self.answers[min(self.requests, len(self.answers) - 1)]
        self.requests += 1
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for piece in pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def ask(
    url: str, content: str = "Go", **settings: Any
) -> tuple[list[ModelReply | ModelError], list[str]]:
    """One request through a running caller: its answers and the text deltas published."""
    bus = Bus()
    deltas: list[str] = []
    watch = bus.subscribe(ModelTextDelta, name="test")
    endpoint = EndpointSettings(
        base_url=url, backoff_base_seconds=0.01, backoff_cap_seconds=0.02, **settings
    )
    caller = LLMCaller(bus, endpoint)
    answers: list[ModelReply | ModelError] = []

    def record(msg: Message) -> None:
        assert isinstance(msg, ModelTextDelta)
        deltas.append(msg.text)

    request = ModelRequest(
        run_id="r1", turn=1, model="m", messages=(ChatMessage(role="user", content=content),)
    )
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            await tg.start(watch.serve, record)
            await tg.start(caller.run)
            with bus.open_inbox("r1") as inbox:
                await bus.publish(request)
                while True:
                    msg = await inbox.receive()
                    assert isinstance(msg, ModelReply | ModelError)
                    answers.append(msg)
                    if isinstance(msg, ModelReply) or msg.final:
                        break
            bus.close()
    return answers, deltas


def pieces_of(stream: bytes, size: int) -> list[bytes]:
    return [stream[i : i + size] for i in range(0, len(stream), size)]


@pytest.mark.asyncio
async def test_the_caller_reads_a_stream_cut_into_tiny_pieces() -> None:
    app = Pieces(pieces_of(STREAM, 5))
    async with open_loopback(app) as url:
        (reply,), deltas = await ask(url)
    assert isinstance(reply, ModelReply)
    assert (reply.text, reply.finish_reason) == ("Hello!", "stop")
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (3, 2)
    assert not reply.usage.estimated
    assert "".join(deltas) == "Hello!"


@pytest.mark.asyncio
async def test_the_caller_publishes_at_most_one_delta_per_read() -> None:
    many = b"".join(frame(text_chunk(f"w{i} ")) for i in range(30))
    answer = [many + frame(text_chunk("end", "stop")) + frame(USAGE) + b"data: [DONE]\n\n"]
    async with open_loopback(Pieces(answer)) as url:
        (reply,), deltas = await ask(url)
    assert isinstance(reply, ModelReply)
    assert reply.text == "".join(f"w{i} " for i in range(30)) + "end"
    assert "".join(deltas) == reply.text
    assert len(deltas) < 31  # one body message: far fewer deltas than chunks


@pytest.mark.asyncio
async def test_the_caller_retries_a_non_json_payload_then_answers() -> None:
    broken = [frame(text_chunk("partial ")), b"data: <html>oops</html>\n\n"]
    good = [frame(text_chunk("fine", "stop")), b"data: [DONE]\n\n"]
    app = Pieces(broken, good)
    async with open_loopback(app) as url:
        answers, deltas = await ask(url)
    retried, reply = answers
    assert isinstance(retried, ModelError)
    assert not retried.final
    assert (retried.kind, retried.attempt) == ("stream", 1)
    assert "malformed stream" in retried.message
    assert isinstance(reply, ModelReply)
    assert (reply.text, reply.attempts) == ("fine", 2)  # nothing of the broken attempt
    assert app.requests == 2
    assert deltas[-1] == "fine"


@pytest.mark.asyncio
async def test_the_caller_ends_a_mid_stream_error_frame_as_the_sdk_did() -> None:
    error = {"error": {"message": "prompt is too long", "type": "invalid_request_error"}}
    app = Pieces([frame(text_chunk("a")), frame(error)])
    async with open_loopback(app) as url:
        (final,), _ = await ask(url)
    assert isinstance(final, ModelError)
    assert (final.kind, final.final, final.status) == ("context_length", True, None)
    assert final.message == "prompt is too long"
    assert app.requests == 1  # never retried: the context gatekeeper owns it


@pytest.mark.asyncio
async def test_the_request_on_the_wire() -> None:
    app = Pieces([frame(text_chunk("ok", "stop")), b"data: [DONE]\n\n"])
    async with open_loopback(app) as url:
        (reply,), _ = await ask(
            url, "Zürich — 東京 \u2028", api_key="sk-wire", default_max_tokens=64
        )
    assert isinstance(reply, ModelReply)
    ((headers, body),) = app.seen
    assert headers["content-type"] == "application/json"
    assert headers["authorization"] == "Bearer sk-wire"
    assert headers["x-loopfuse-run-id"] == "r1"
    assert json.loads(body) == {
        "model": "m",
        "messages": [{"role": "user", "content": "Zürich — 東京 \u2028"}],
        "max_tokens": 64,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
