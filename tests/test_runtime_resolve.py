"""Runs started with the same overrides share what those overrides resolve to."""

from __future__ import annotations

import pytest

from bench.scripted_model import ScriptedModel, echo_script
from orchestrator.errors import ConfigError
from orchestrator.runtime import RunSpec, Runtime


def runtime() -> Runtime:
    return Runtime(model_actor=lambda bus: ScriptedModel(bus, echo_script(1)))


@pytest.mark.asyncio
async def test_same_overrides_share_their_settings_and_others_do_not() -> None:
    async with runtime() as rt:
        first = rt._resolve({"max_turns": 7, "loop": {"history_size": 12}})
        again = rt._resolve({"loop": {"history_size": 12}, "max_turns": 7})  # key order
        other = rt._resolve({"max_turns": 8})
        results = [await rt.run(RunSpec(task="t", overrides={"max_turns": 7})) for _ in range(2)]
    assert again is first
    assert first.settings.max_turns == 7
    assert first.loop.history_size == 12
    assert other.settings.max_turns == 8
    assert other is not first
    assert [r.exit_reason.value for r in results] == ["completed", "completed"]


@pytest.mark.asyncio
async def test_a_bad_override_is_refused_every_time() -> None:
    async with runtime() as rt:
        for _ in range(2):
            with pytest.raises(ConfigError, match="max_turns"):
                await rt.start(RunSpec(task="t", overrides={"max_turns": 0}))
            with pytest.raises(ConfigError, match="unknown tools: nope"):
                await rt.start(RunSpec(task="t", overrides={"tools": ["nope"]}))
