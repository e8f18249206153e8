"""Bus throughput: messages per second through ``publish`` and ``publish_settled``.

``subscribers`` answering subscribers (no-op handlers) all take ``TurnEnded``; one
publisher sends ``messages`` of them. With queued subscribers ``publish`` only queues (the
subscribers drain in batches) and ``publish_settled`` waits, message by message, until
every subscriber handled it; with inline subscribers (how loopfuse's monitors subscribe)
both call every handler during the publish.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import anyio

from bus import Bus, Message, TurnEnded

__all__ = ["BusFigures", "measure_bus"]


class BusFigures(NamedTuple):
    """Messages per second, both ways."""

    subscribers: int
    messages: int
    publish_per_second: float
    settled_per_second: float
    inline_publish_per_second: float = 0.0
    inline_settled_per_second: float = 0.0


def _ignore(msg: Message) -> None:
    return None


async def _through(
    subscribers: int, messages: int, *, settled: bool, inline: bool = False
) -> float:
    bus = Bus()
    batch = [TurnEnded(run_id=f"run-{i % 100}", turn=i, tool_calls=0) for i in range(messages)]
    async with anyio.create_task_group() as tg:
        for index in range(subscribers):
            sub = bus.subscribe(TurnEnded, name=f"sub{index}", answers=True, inline=inline)
            await tg.start(sub.serve, _ignore)
        started = time.perf_counter()
        if settled:
            for msg in batch:
                await bus.publish_settled(msg)
        else:
            for msg in batch:
                await bus.publish(msg)
        bus.close()  # subscribers finish their queues, then stop
    return messages / (time.perf_counter() - started)


async def measure_bus(subscribers: int = 5, messages: int = 50_000) -> BusFigures:
    """Both publishes through ``subscribers`` subscribers; the time includes handling."""
    return BusFigures(
        subscribers,
        messages,
        await _through(subscribers, messages, settled=False),
        await _through(subscribers, messages, settled=True),
        await _through(subscribers, messages, settled=False, inline=True),
        await _through(subscribers, messages, settled=True, inline=True),
    )
