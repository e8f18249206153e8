"""read_image end to end: the simulator takes content parts through the real ``openai``
client, the report_vision scenario's request after read_image carries the image, and the
vision flag decides whether explore is offered the tool."""

from __future__ import annotations

import base64
import contextlib
import shutil
import struct
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import msgspec
import openai
import pytest

import orchestrator.sim.app
from bus import ExitReason, RunStarted
from orchestrator.config import Config, ModelCapabilities
from orchestrator.pipeline import Probes
from orchestrator.report import SAMPLE_FOLDER, ReportOptions, simulated_models, start_report
from orchestrator.result import RunResult
from orchestrator.runtime import Runtime
from orchestrator.scenarios.runs import expectation_mismatches, start_scenario
from orchestrator.sim import Scenario, make_app, parse_scenario, shipped_scenarios
from orchestrator.sim.content import RequestImages, request_images

PHOTO_URL = "data:image/png;base64," + base64.b64encode(
    (SAMPLE_FOLDER / "plate_photo.png").read_bytes()
).decode("ascii")
# A PNG header claiming 2048 × 4096 pixels (1,105 tokens at high detail), 80 KB of base64.
BIG_URL = "data:image/png;base64," + base64.b64encode(
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + struct.pack(">II", 2048, 4096) + bytes(60_000)
).decode("ascii")

ECHO = parse_scenario(
    'task = "t"\n[[steps]]\ntext = "I see it."\nrepeat = true\n[expect]\nexit_reason = "completed"',
    source="m.toml",
    name="m",
)
NEEDS_IMAGE = parse_scenario(
    'task = "t"\n[[steps]]\nrequire_images = 1\ntext = "I see it."\nrepeat = true\n'
    '[expect]\nexit_reason = "completed"',
    source="needs.toml",
    name="needs",
)


@contextlib.asynccontextmanager
async def client_for(*scenarios: Scenario) -> AsyncIterator[openai.AsyncOpenAI]:
    http = openai.DefaultAsyncHttpxClient(transport=httpx2.ASGITransport(app=make_app(scenarios)))
    async with openai.AsyncOpenAI(
        base_url="http://sim/v1", api_key="sim", max_retries=0, http_client=http
    ) as client:
        yield client


def _image(url: str, detail: str = "high") -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, "detail": detail}}


# ------------------------------------------------------------------------ the simulator


@pytest.mark.asyncio
async def test_the_simulator_takes_content_parts_and_prices_images_by_size() -> None:
    looking: list[Any] = [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, _image(BIG_URL)]}
    ]
    async with client_for(ECHO, NEEDS_IMAGE) as client:
        reply = await client.chat.completions.create(model="m", messages=looking)
        assert reply.choices[0].message.content == "I see it."
        assert reply.usage is not None
        # the URL's 80,000 characters would be 20,000 tokens; the image costs 1,105
        assert 1105 < reply.usage.prompt_tokens < 1105 + 100
        needs = await client.chat.completions.create(model="needs", messages=looking)
        assert needs.choices[0].message.content == "I see it."


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("messages", "where"),
    [
        (
            [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "read_image", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c", "content": [_image(PHOTO_URL)]},
            ],
            "messages[2].content[0]: image content parts are only allowed in user messages",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "video"}]}],
            "messages[0].content[1].type: 'video' is not 'text' or 'image_url'",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": PHOTO_URL, "detail": "max"}}
                    ],
                }
            ],
            "messages[0].content[0].image_url.detail: 'max' is not one of auto, low, high",
        ),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": "plate.png"}]}],
            "messages[0].content[0].image_url: needs an object with a string 'url'",
        ),
        ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text"),
        ([{"role": "user", "content": {"type": "text"}}], "messages[0].content: must be a string"),
    ],
)
async def test_malformed_content_parts_are_a_clear_400(messages: list[Any], where: str) -> None:
    async with client_for(ECHO, NEEDS_IMAGE) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="m", messages=messages)
    assert caught.value.code == "invalid_content"
    assert where in caught.value.message


@pytest.mark.asyncio
async def test_a_step_that_requires_an_image_refuses_a_request_without_one() -> None:
    async with client_for(ECHO, NEEDS_IMAGE) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="needs", messages=[{"role": "user", "content": "no image"}]
            )
    assert caught.value.code == "scenario_expectation"
    assert "requires 1 image(s) in the request; it has 0" in caught.value.message


# ------------------------------------------------------------------- the report_vision run


@pytest.fixture
def request_log(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[str, Any]]]:
    """Every request's ``(role, content)`` pairs as the simulator decoded them."""
    log: list[list[tuple[str, Any]]] = []
    checked = request_images

    def recording(messages: Iterable[tuple[str, Any]]) -> RequestImages:
        seen = list(messages)
        log.append(seen)
        return checked(seen)

    monkeypatch.setattr(orchestrator.sim.app, "request_images", recording)
    return log


def _explore_tools(runtime: Runtime, run_id: str) -> tuple[str, ...]:
    started = [
        e for e in runtime.event_log.events(f"{run_id}.explore") if isinstance(e, RunStarted)
    ]
    return started[0].tools


@pytest.mark.asyncio
async def test_the_request_after_read_image_carries_the_photo(
    request_log: list[list[tuple[str, Any]]],
) -> None:
    # Over the wire (the log is the simulator's): in process, no request is encoded.
    shipped = {s.name: s for s in shipped_scenarios()}["report_vision"]
    scenario = msgspec.structs.replace(shipped, wire=True)
    async with Runtime(scenarios=[scenario]) as runtime:
        with anyio.fail_after(30):
            handle = await start_scenario(runtime, scenario)
            result = await handle.result()
        tools = _explore_tools(runtime, handle.run_id)
    assert expectation_mismatches(scenario, result) == []
    assert "read_image" in tools

    explore = [r for r in request_log if r[0][1].startswith("You explore a data folder")]
    assert len(explore) == 4
    assert not any(isinstance(content, list) for _, content in explore[1])  # before the read
    after = explore[2]
    index = next(i for i, (role, c) in enumerate(after) if role == "tool" and "read_image:" in c)
    content = after[index][1]
    assert content.startswith("read_image: plate_photo.png (PNG, 32×16 px, 1,240 bytes")
    assert "base64" not in content
    assert after[index + 1] == (
        "user",
        [
            {"type": "text", "text": "The image(s) returned by tool call call_1_0:"},
            {"type": "image_url", "image_url": {"url": PHOTO_URL, "detail": "low"}},
        ],
    )
    # the draft and reflect stages get what explore concluded, never the image data
    later = [r for r in request_log if not r[0][1].startswith("You explore a data folder")]
    assert later
    assert all("base64" not in str(r) for r in later)


async def _vision_report(tmp_path: Path, config: Config) -> tuple[RunResult, tuple[str, ...]]:
    folder = tmp_path / "folder"
    shutil.copytree(SAMPLE_FOLDER, folder)
    options = ReportOptions(
        goal="Lag time and growth rate",
        out=str(tmp_path / "out" / "report.md"),
        models=simulated_models("report_vision"),
    )
    async with Runtime(config) as runtime:
        with anyio.fail_after(30):
            handle = await start_report(runtime, folder, options, probes=Probes())
            result = await handle.result()
        return result, _explore_tools(runtime, handle.run_id)


@pytest.mark.asyncio
async def test_the_models_vision_flag_offers_read_image_to_explore(tmp_path: Path) -> None:
    vision = Config(models={"report_vision/explore": ModelCapabilities(vision=True)})
    result, tools = await _vision_report(tmp_path, vision)
    assert tools == ("list_dir", "read_file", "read_image", "finish_exploration")
    assert result.exit_reason is ExitReason.COMPLETED
    assert not result.degraded


@pytest.mark.asyncio
async def test_without_the_flag_explore_has_no_read_image_and_the_image_never_arrives(
    tmp_path: Path,
) -> None:
    result, tools = await _vision_report(tmp_path, Config())
    assert "read_image" not in tools
    # the scripted call of read_image is refused as an unknown tool, so the next request
    # carries no image and the simulator's require_images refuses it: explore degrades
    assert result.exit_reason is ExitReason.COMPLETED
    assert result.degraded
    assert (tmp_path / "out" / "report.md").exists()
