"""The public names of each package are listed once in ``__all__`` and all importable
(ruff's RUF022 keeps each ``__all__`` in order)."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "bus",
    "bus.aio_seam",
    "bus.bus",
    "bus.exit",
    "bus.messages",
    "bus.transcript",
    "actors.tools",
    "actors.loop",
    "orchestrator.sim",
    "orchestrator.scenarios.corpus",
    "orchestrator.daemon",
    "orchestrator.daemon.client",
    "orchestrator.metrics",
    "orchestrator.conductor",
    "actors.hooks",
    "actors.context",
    "orchestrator.config",
    "orchestrator.errors",
    "orchestrator.result",
    "orchestrator.runtime",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_unique_and_importable(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported)), f"{name}.__all__ repeats a name"
    missing = [attr for attr in exported if not hasattr(module, attr)]
    assert missing == []


def test_bus_reexports_every_message_type() -> None:
    import bus

    for kind in bus.MESSAGE_TYPES:
        assert getattr(bus, kind.__name__) is kind


def test_every_public_exception_is_a_loopfuse_error() -> None:
    from orchestrator import errors

    for attr in errors.__all__:
        assert issubclass(getattr(errors, attr), errors.LoopfuseError)
