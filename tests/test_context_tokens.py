"""Token estimates: the real OpenAI vocabularies offline, the fallback's bound, model windows."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from actors.context import (
    DEFAULT_WINDOW,
    FALLBACK_MARGIN,
    Calibration,
    Estimator,
    bpe_counter,
    encoding_for,
    window_for,
)
from actors.context.tokens import MESSAGE_OVERHEAD
from bus import ChatMessage, ToolCall, ToolSpec

# Counts by tiktoken's own vocabularies, cross-checked with an independent implementation
# (quicktok); ("tiktoken is great!" is tiktoken's README example: 6 tokens in cl100k).
REFERENCE = [
    ("tiktoken is great!", 6, 6),
    ("Hello, world! The quick brown fox jumps over the lazy dog.", 14, 14),
    ("把所有 console.log 替换成 logger.info", 10, 11),
    ("def f(x):\n    return x * 2  # doubled\n", 14, 14),
    ('{"id": 12345, "value": 3.14159, "tags": ["a", "b"]}', 26, 25),
    ("Привет, мир!", 5, 7),
    ("🚀🔥✅", 4, 8),
]


@pytest.mark.parametrize(("text", "o200k", "cl100k"), REFERENCE)
def test_openai_vocabularies_count_exactly_offline(text: str, o200k: int, cl100k: int) -> None:
    assert bpe_counter("o200k_base")(text) == o200k
    assert bpe_counter("cl100k_base")(text) == cl100k


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini-2024-07-18", "o200k_base"),
        ("openai/gpt-4.1-mini", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("gpt-4-0613", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("deepseek-chat", None),
        ("qwen2.5:7b", None),
        ("ollama", None),
    ],
)
def test_each_openai_model_gets_its_own_vocabulary(model: str, encoding: str | None) -> None:
    assert encoding_for(model) == encoding


@pytest.mark.parametrize(("text", "o200k", "cl100k"), REFERENCE)
def test_an_openai_models_estimate_is_its_tokenizers_count(
    text: str, o200k: int, cl100k: int
) -> None:
    for model, expected in (("gpt-4o", o200k), ("gpt-4", cl100k)):
        estimate = Estimator(model).text(text)
        assert (estimate.tokens, estimate.floor) == (expected, expected)


def _corpus() -> dict[str, str]:
    rng = random.Random(7)
    source = Path(__file__).resolve().parent.parent / "actors" / "context" / "planning.py"
    prose = (
        "The team followed the standard operating procedure and recorded every deviation "
        "in the shared notebook, so that the comparison between strains stays fair. "
    ) * 20
    records = [{"id": i, "name": f"item-{i}", "value": rng.random()} for i in range(80)]
    csv = "\n".join(",".join(f"{rng.uniform(0, 100):.3f}" for _ in range(6)) for _ in range(80))
    return {
        "prose": prose,
        "code": source.read_text(encoding="utf-8"),
        "json": json.dumps(records),
        "csv": csv,
        "chinese": "模型只负责提议，控制层决定执行什么。每一次运行都会结束，并给出原因。" * 20,
        "russian": "Привет, мир! Это тестовый текст на русском языке. " * 20,
        "hex": " ".join(rng.randbytes(16).hex() for _ in range(40)),
        "emoji": "🚀🔥✅ done 🎉 " * 30,
    }


@pytest.mark.parametrize("kind", sorted(_corpus()))
def test_the_fallback_never_counts_below_either_openai_vocabulary(kind: str) -> None:
    text = _corpus()[kind]
    real = max(bpe_counter("o200k_base")(text), bpe_counter("cl100k_base")(text))
    estimate = Estimator("some-local-model").text(text)
    assert estimate.tokens >= real * FALLBACK_MARGIN * 0.999
    assert estimate.floor == bpe_counter("cl100k_base")(text)


@pytest.mark.parametrize("kind", ["prose", "code", "chinese"])
def test_the_fallback_is_not_wildly_pessimistic_on_text(kind: str) -> None:
    text = _corpus()[kind]
    real = max(bpe_counter("o200k_base")(text), bpe_counter("cl100k_base")(text))
    assert Estimator("some-local-model").text(text).tokens <= real * 1.25


def test_the_fallback_counts_every_digit_as_a_token() -> None:
    # Qwen splits numbers into single digits; cl100k into groups of three.
    estimate = Estimator("qwen2.5:7b").text("123456789")
    assert estimate.floor == bpe_counter("cl100k_base")("123456789") == 3
    assert estimate.tokens >= 9


def test_a_message_counts_content_calls_and_framing() -> None:
    counted: list[str] = []

    def spy(text: str) -> int:
        counted.append(text)
        return len(text)

    estimator = Estimator("gpt-4o", counter=spy)
    call = ToolCall(id="call_1", name="read_file", arguments='{"path": "a"}')
    assistant = estimator.message(ChatMessage(role="assistant", content="ok", tool_calls=(call,)))
    assert counted == ["ok", "read_file", '{"path": "a"}']
    assert assistant.tokens > MESSAGE_OVERHEAD + 2 + 9 + 13
    tools = estimator.tools((ToolSpec(name="t", description="d", parameters="{}"),))
    assert tools.tokens > 0
    assert estimator.message(ChatMessage(role="assistant")).tokens == MESSAGE_OVERHEAD


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4o", 128_000),
        ("gpt-4", 8_192),
        ("gpt-4-0613", 8_192),
        ("gpt-4-turbo-preview", 128_000),
        ("gpt-4.1-mini", 1_047_576),
        ("gpt-3.5-turbo-0125", 16_385),
        ("o1-mini", 128_000),
        ("o3", 200_000),
        ("deepseek-chat", 131_072),
        ("deepseek-r1:14b", 131_072),
        ("qwen2.5:7b", 32_768),
        ("llama3:8b", 8_192),
        ("llama3.1:70b", 131_072),
        ("meta-llama/Llama-3.1-8B-Instruct", 131_072),
        ("mistral", 32_768),
        ("completed", DEFAULT_WINDOW),
    ],
)
def test_common_models_have_their_windows(model: str, window: int) -> None:
    assert window_for(model) == window


def test_configured_windows_come_first_and_the_default_last() -> None:
    assert window_for("gpt-4o-mini", {"gpt-4o": 64_000}) == 64_000
    assert window_for("my-model-v2", {"my-model": 4_096}) == 4_096
    assert window_for("mymodel", {"my-model": 4_096}, default=1_000) == 1_000


def test_calibration_learns_per_model_and_lowers_estimates_only_a_little() -> None:
    calibration = Calibration()
    assert calibration.apply("m", 1_000) == 1_000
    calibration.observe("m", estimated=1_000, reported=2_000)
    assert calibration.ratio("m") == 2.0
    assert calibration.apply("m", 1_000) == 2_000
    assert calibration.ratio("other") == 1.0
    calibration.observe("m", estimated=1_000, reported=1_000)
    assert 1.0 < calibration.ratio("m") < 2.0  # a moving average, not the last sample
    low = Calibration()
    low.observe("m", estimated=1_000, reported=100)
    assert low.ratio("m") == 0.8
    assert low.samples("m") == 1


if __name__ == "__main__":  # python -m tests.test_context_tokens
    print(f"{'content':8} {'o200k':>7} {'cl100k':>7} {'fallback':>8} {'floor':>7}  fallback/max")
    for name, sample in _corpus().items():
        o200k, cl100k = bpe_counter("o200k_base")(sample), bpe_counter("cl100k_base")(sample)
        estimate = Estimator("some-local-model").text(sample)
        ratio = estimate.tokens / max(o200k, cl100k)
        print(f"{name:8} {o200k:7} {cl100k:7} {estimate.tokens:8} {estimate.floor:7}  {ratio:.2f}")
