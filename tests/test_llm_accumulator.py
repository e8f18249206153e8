"""The streaming reply accumulator: tool-call assembly under server quirks (ecosystem §4.3)."""

from __future__ import annotations

from typing import cast

import msgspec
from openai._models import construct_type
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from actors.llm.accumulator import ReplyAccumulator, is_json
from actors.llm.chunks import Chunk, _loose, decode_chunk
from bus import ToolCall, Usage


def parse(data: dict[str, object]) -> ChatCompletionChunk:
    """A chunk built the way the SDK builds one: constructed from JSON, never validated."""
    return cast(ChatCompletionChunk, construct_type(type_=ChatCompletionChunk, value=data))


def frame(delta: dict[str, object], finish: str | None = None) -> ChatCompletionChunk:
    return parse(
        {
            "id": "x",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def call(
    index: int | None, id: str | None = None, name: str | None = None, args: str | None = None
):
    entry: dict[str, object] = {"function": {}}
    if index is not None:
        entry["index"] = index
    if id is not None:
        entry["id"] = id
        entry["type"] = "function"
    if name is not None:
        entry["function"] = {"name": name}
    if args is not None:
        entry["function"] = {**entry["function"], "arguments": args}  # type: ignore[dict-item]
    return frame({"tool_calls": [entry]})


def feed(acc: ReplyAccumulator, *chunks: ChatCompletionChunk) -> None:
    for c in chunks:
        acc.feed_chunk(c)


def test_fragmented_arguments_are_concatenated_by_index() -> None:
    acc = ReplyAccumulator()
    feed(
        acc,
        frame({"role": "assistant", "content": None}),
        call(0, "call_a", "get_weather", ""),
        call(0, args='{"ci'),
        call(0, args='ty":"Paris"}'),
        frame({}, finish="tool_calls"),
    )
    out = acc.assemble()
    assert out.tool_calls == (
        ToolCall(id="call_a", name="get_weather", arguments='{"city":"Paris"}'),
    )
    assert out.invalid == ()
    assert acc.finish_reason == "tool_calls"


def test_parallel_calls_by_index_even_interleaved_in_one_chunk() -> None:
    acc = ReplyAccumulator()
    both = frame(
        {
            "tool_calls": [
                {"index": 1, "function": {"arguments": "{}"}},
                {"index": 0, "function": {"arguments": '"x"}'}},
            ]
        }
    )
    feed(acc, call(0, "a", "one", '{"q":'), call(1, "b", "two", ""), both)
    assert acc.assemble().tool_calls == (
        ToolCall(id="a", name="one", arguments='{"q":"x"}'),
        ToolCall(id="b", name="two", arguments="{}"),
    )


def test_id_and_name_repeated_in_every_fragment_are_kept_once() -> None:
    acc = ReplyAccumulator()
    feed(
        acc,
        call(0, "call_1", "read_file", '{"pa'),
        call(0, "call_1", "read_file", 'th":"a.txt"}'),
    )
    assert acc.assemble().tool_calls == (
        ToolCall(id="call_1", name="read_file", arguments='{"path":"a.txt"}'),
    )


def test_cumulative_arguments_replace_the_buffer() -> None:
    acc = ReplyAccumulator()
    feed(acc, call(0, "c", "f", '{"a"'), call(0, args='{"a": 1'), call(0, args='{"a": 1}'))
    assert acc.assemble().tool_calls[0].arguments == '{"a": 1}'


def test_summary_chunk_repeating_the_call_is_deduplicated() -> None:
    acc = ReplyAccumulator()
    feed(
        acc,
        call(0, "c1", "search", '{"q":'),
        call(0, args=' "cats"}'),
        # the same call again, whole, differently spaced, at the same index …
        call(0, "c1", "search", '{"q":"cats"}'),
        # … and once more at another index, and once without an id at a third
        call(1, "c1", "search", '{"q":"cats"}'),
        call(2, None, "search", '{"q":"cats"}'),
    )
    out = acc.assemble()
    assert out.tool_calls == (ToolCall(id="c1", name="search", arguments='{"q":"cats"}'),)


def test_every_call_at_index_zero_with_distinct_ids_stays_distinct() -> None:
    acc = ReplyAccumulator()
    feed(acc, call(0, "a", "f", '{"n":1}'), call(0, "b", "f", '{"n":2}'))
    assert [c.id for c in acc.assemble().tool_calls] == ["a", "b"]


def test_missing_index_and_missing_id() -> None:
    acc = ReplyAccumulator()
    feed(acc, call(None, None, "f", '{"a":'), call(None, args="1}"))
    (only,) = acc.assemble().tool_calls
    assert only.name == "f"
    assert only.arguments == '{"a":1}'
    assert only.id.startswith("call_")
    assert acc.assemble().tool_calls[0].id == only.id  # generated once


def test_invalid_json_is_reported_not_raised() -> None:
    acc = ReplyAccumulator()
    feed(
        acc,
        call(0, "ok", "f", "{}"),
        call(1, "bad", "g", '{"x": '),
        call(2, "nameless", None, "{}"),
    )
    out = acc.assemble()
    assert [c.id for c in out.tool_calls] == ["ok", "bad", "nameless"]
    assert out.invalid == ("bad", "nameless")


def test_empty_arguments_mean_no_arguments() -> None:
    acc = ReplyAccumulator()
    feed(acc, call(0, "c", "now", ""))
    assert acc.assemble().tool_calls[0].arguments == "{}"


def test_partial_assembly_drops_incomplete_calls() -> None:
    acc = ReplyAccumulator()
    feed(
        acc,
        call(0, "done", "f", '{"a":1}'),
        call(1, "half", "g", '{"b":'),
        call(2, "empty", "h", ""),
    )
    out = acc.assemble(partial=True)
    assert [c.id for c in out.tool_calls] == ["done"]
    assert out.invalid == ()


def test_text_and_tool_calls_in_one_reply_with_usage_chunk() -> None:
    acc = ReplyAccumulator()
    texts = [
        acc.feed_chunk(frame({"role": "assistant", "content": ""})),
        acc.feed_chunk(frame({"content": "Let me look."})),
        acc.feed_chunk(call(0, "c", "f", "{}")),
        acc.feed_chunk(frame({}, finish="tool_calls")),
        acc.feed_chunk(
            parse(
                {
                    "id": "x",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "m",
                    "choices": [],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                    "obfuscation": "pad",
                }
            )
        ),
    ]
    assert texts == ["", "Let me look.", "", "", ""]
    assert acc.text == "Let me look."
    assert len(acc.assemble().tool_calls) == 1
    assert acc.usage == Usage(prompt_tokens=10, completion_tokens=5)


def test_tolerates_odd_chunks() -> None:
    acc = ReplyAccumulator()
    odd = [
        parse({"id": "x", "choices": None}),
        parse({"id": "x"}),
        parse({"choices": [{"index": 0}]}),
        parse({"choices": [{"index": 0, "delta": {"content": None, "tool_calls": None}}]}),
        parse({"choices": [{"index": 1, "delta": {"content": "other choice"}}]}),
        parse({"choices": [{"index": 0, "delta": {"content": "ok", "reasoning_content": "hm"}}]}),
        parse({"choices": [], "usage": {"prompt_tokens": "many"}}),
    ]
    feed(acc, *odd)
    assert acc.text == "ok"
    assert acc.usage is None
    assert acc.finish_reason is None


def test_whole_completion() -> None:
    message = {
        "role": "assistant",
        "content": "hi",
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    completion = construct_type(
        type_=ChatCompletion,
        value={
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": message}],
        },
    )
    acc = ReplyAccumulator()
    assert acc.feed_completion(completion) == "hi"
    assert acc.assemble().tool_calls == (ToolCall(id="c", name="f", arguments="{}"),)
    assert acc.finish_reason == "tool_calls"
    assert acc.usage is None


def test_is_json() -> None:
    assert is_json("{}")
    assert is_json("[1, 2]")
    assert not is_json('{"a": ')
    assert not is_json("{}{}")
    assert not is_json("")


def test_two_calls_under_one_id_are_both_kept_the_second_under_an_id_of_its_own() -> None:
    acc = ReplyAccumulator()
    feed(acc, call(0, "call_0", "list_dir", '{"path":"."}'), call(1, "call_0", "read_file", "{}"))
    first, second = acc.assemble().tool_calls
    assert first == ToolCall(id="call_0", name="list_dir", arguments='{"path":"."}')
    assert (second.name, second.arguments, second.wire_id) == ("read_file", "{}", "call_0")
    assert second.id not in ("call_0", "")
    assert acc.assemble().tool_calls[1].id == second.id  # made once
    # The same name, other arguments: another call too.
    acc = ReplyAccumulator()
    feed(acc, call(0, "c", "read_file", '{"path":"a"}'), call(1, "c", "read_file", '{"path":"b"}'))
    assert [c.arguments for c in acc.assemble().tool_calls] == ['{"path":"a"}', '{"path":"b"}']


def test_calls_without_ids_are_kept_apart_with_ids_of_their_own() -> None:
    acc = ReplyAccumulator()
    feed(acc, call(0, "", "f", '{"n":1}'), call(1, "", "f", '{"n":2}'))
    one, two = acc.assemble().tool_calls
    assert (one.arguments, two.arguments) == ('{"n":1}', '{"n":2}')
    assert one.id != two.id
    assert one.wire_id is None  # no id of the server's to send back


def test_every_fragment_repeating_index_id_type_and_name_assembles_one_call() -> None:
    """llama-cpp-python's shape: the head in every chunk, some fragments empty, the legacy
    ``function_call`` alongside (ignored)."""
    head = {"index": 0, "id": "call__0_read_file_cmpl-1", "type": "function"}

    def piece(arguments: str) -> ChatCompletionChunk:
        function = {"name": "read_file", "arguments": arguments}
        delta = {"role": None, "content": None, "function_call": function}
        return frame({**delta, "tool_calls": [{**head, "function": function}]})

    acc = ReplyAccumulator()
    first = frame({"role": "assistant", "content": None, "function_call": None, "tool_calls": None})
    feed(acc, first, piece('{"pa'), piece(""), piece('th": "a'), piece('.txt"}'), piece(""))
    feed(acc, frame({"content": None, "tool_calls": None}, finish="tool_calls"))
    out = acc.assemble()
    assert out.tool_calls == (
        ToolCall(id="call__0_read_file_cmpl-1", name="read_file", arguments='{"path": "a.txt"}'),
    )
    assert out.invalid == ()


def tool(index: int | None, id: str | None = None, name: str | None = None, args: str = ""):
    entry: dict[str, object] = {"function": {"name": name, "arguments": args}}
    if index is not None:
        entry["index"] = index
    if id is not None:
        entry["id"] = id
    return {"choices": [{"index": 0, "delta": {"tool_calls": [entry]}}]}


STREAMS: list[list[dict[str, object]]] = [
    [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
        {"choices": [{"index": 1, "delta": {"content": "other choice"}}]},
        {"choices": [{"delta": {"content": "lo", "refusal": "!"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    ],
    [
        tool(0, "a", "ls", '{"p'),
        tool(0, args='": 1}'),
        tool(None, "b", "cat", "{}"),
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 2, "id": "c"}]}}]},
        {"choices": None, "usage": {"prompt_tokens": 5}},
        {"choices": [{"index": None, "delta": None, "finish_reason": "tool_calls"}]},
    ],
]


def test_a_typed_chunk_accumulates_as_the_lenient_view_and_the_sdks_model() -> None:
    for stream in STREAMS:
        results = []
        for way in ("typed", "lenient", "sdk"):
            acc = ReplyAccumulator()
            returned = []
            for data in stream:
                raw = msgspec.json.encode(data)
                if way == "typed":
                    chunk: object = decode_chunk(raw)
                    assert type(chunk) is Chunk
                elif way == "lenient":
                    chunk = _loose(msgspec.json.decode(raw))
                else:
                    chunk = parse(data)
                returned.append(acc.feed_chunk(chunk))
            results.append((returned, acc.text, acc.finish_reason, acc.usage, acc.assemble()))
        assert results[0] == results[1] == results[2]
        assert results[0][1] or results[0][4].tool_calls  # something was accumulated


def test_the_response_id_and_model_are_the_first_the_server_sent() -> None:
    """#30 item 12: ``gen_ai.response.id``/``model`` of a chat span come from here."""
    from actors.llm.chunks import decode_chunk, decode_completion

    streamed = ReplyAccumulator()
    streamed.feed_chunk(decode_chunk(b'{"id":"chatcmpl-1","model":"m-2026","choices":[]}'))
    streamed.feed_chunk(decode_chunk(b'{"id":"other","model":"other","choices":[]}'))
    assert (streamed.response_id, streamed.response_model) == ("chatcmpl-1", "m-2026")
    odd = ReplyAccumulator()  # a chunk that does not fit the typed view: read leniently
    odd.feed_chunk(decode_chunk(b'{"id":"x-1","model":"m","usage":{"prompt_tokens":"many"}}'))
    assert (odd.response_id, odd.response_model) == ("x-1", "m")
    whole = ReplyAccumulator()
    whole.feed_completion(decode_completion(b'{"id":"c-9","model":"m","choices":[]}'))
    assert (whole.response_id, whole.response_model) == ("c-9", "m")
    none = ReplyAccumulator()
    none.feed_chunk(decode_chunk(b'{"choices":[]}'))
    assert (none.response_id, none.response_model) == ("", "")
