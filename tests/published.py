"""A real bus that keeps every message published on it, for an actor's handler called
directly (its answers go out with ``publish_nowait``); :func:`feed` calls an actor's
functions by type as the bus does.

A real :class:`bus.Bus` rather than a stand-in or a subclass: the compiled build checks
that an actor is given a ``Bus``, and compiled classes cannot be subclassed from Python.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bus import Bus, Message


class Published:
    """:attr:`bus`, and :attr:`messages`: everything published on it so far, in order."""

    def __init__(self) -> None:
        self.bus = Bus()
        # Every message type; never served, so each message waits in the mailbox.
        self._everything = self.bus.subscribe(name="published")
        self._kept: list[Message] = []

    @property
    def messages(self) -> list[Message]:
        self._kept.extend(msg for msg, _ in self._everything.mailbox.drain())
        return self._kept


def feed(handlers: Mapping[type[Message], Callable[[Any], None]], *messages: Message) -> None:
    """Call the function ``handlers`` (an actor's ``handlers()``) has for each message's
    type, in order, as the bus does; a type it has none for is not delivered."""
    for msg in messages:
        function = handlers.get(type(msg))
        if function is not None:
            function(msg)
