"""The process heap is frozen out of the cycle collector once, with the tokenizer in it."""

from __future__ import annotations

import gc

import pytest

import orchestrator.runtime.runtime
from actors.context import bpe_counter
from orchestrator.config import Config, RuntimeSettings
from orchestrator.runtime import Runtime
from orchestrator.runtime.heap import freeze_long_lived


def test_the_heap_is_frozen_once_with_the_tokenizer_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    freeze_long_lived("gpt-4o")  # froze now, or an earlier runtime of this process did
    assert gc.get_freeze_count() > 10_000  # the modules imported so far at least
    assert bpe_counter.cache_info().currsize >= 1  # loaded before freezing

    def refreeze() -> None:
        raise AssertionError("froze twice")

    monkeypatch.setattr(gc, "freeze", refreeze)
    assert freeze_long_lived("gpt-4o") is False


@pytest.mark.parametrize("freeze", [True, False])
@pytest.mark.asyncio
async def test_a_runtime_freezes_the_heap_unless_told_not_to(
    freeze: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    models: list[str] = []

    def spy(model: str) -> bool:
        models.append(model)
        return False

    monkeypatch.setattr(orchestrator.runtime.runtime, "freeze_long_lived", spy)
    config = Config(runtime=RuntimeSettings(freeze_heap=freeze))
    async with Runtime(config):
        pass
    assert models == ([config.model.model] if freeze else [])
