"""One run's result cache for idempotent tools: bounded (LRU), with a TTL and hit counts.

A key is a call fingerprint (:func:`actors.fingerprint.fingerprint_call`: tool name plus
canonical arguments). Only successful results are stored; the tool executor decides what
goes in. Every :meth:`ResultCache.lookup` of a stored key counts a hit on its entry; the
hit that takes the count past ``max_hits`` is a loop (seed 002: the model keeps asking for
a result it already has), and the caller refuses it instead of answering from the cache.

Hits are counted per entry: an entry that expires (``ttl_seconds`` after it was stored)
or is evicted (the least recently used one goes once ``max_entries`` is exceeded) takes
its count with it, so the next call runs the tool again and starts a new count.
``max_entries == 0`` turns the cache off: nothing is stored and every lookup misses.

::

    cache = ResultCache(CacheSettings(max_hits=2, ttl_seconds=300, max_entries=256))
    cache.lookup(key)          # Lookup("miss")       -> run the tool, then:
    cache.store(key, text)
    cache.lookup(key)          # Lookup("hit", text, hits=1)
    cache.lookup(key)          # Lookup("hit", text, hits=2)
    cache.lookup(key)          # Lookup("loop", hits=3): refuse the call, stop the run
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, Literal, NamedTuple

__all__ = ["DEFAULT_CACHE_SETTINGS", "CacheSettings", "CacheStatus", "Lookup", "ResultCache"]

CacheStatus = Literal["miss", "hit", "loop"]


class CacheSettings(NamedTuple):
    """How one run's cache behaves (the run's ``max_cache_hits``, ``cache_ttl_seconds``,
    ``cache_max_entries``)."""

    max_hits: int = 2
    """Hits allowed on one entry; the next one is a loop (0: the first hit is a loop)."""
    ttl_seconds: float = 300.0
    """An entry is served for this long after it was stored, then the tool runs again."""
    max_entries: int = 256
    """Entries kept; the least recently used one goes first (0: the cache is off)."""


DEFAULT_CACHE_SETTINGS: Final = CacheSettings()


class Lookup(NamedTuple):
    """What :meth:`ResultCache.lookup` found.

    ``content`` is the cached text for a ``hit`` (empty otherwise); ``hits`` counts the
    entry's hits including this one (0 for a ``miss``).
    """

    status: CacheStatus
    content: str = ""
    hits: int = 0


class _Entry:
    __slots__ = ("content", "expires_at", "hits")

    def __init__(self, content: str, expires_at: float) -> None:
        self.content = content
        self.expires_at = expires_at
        self.hits = 0


class ResultCache:
    """Successful results of idempotent calls, by call fingerprint, for one run.

    :param settings: hit limit, TTL and size bound.
    :param clock: seconds, monotonic (injected by tests).
    :raises ValueError: a setting is out of range (the message names it).
    """

    __slots__ = ("_by_age", "_by_use", "_clock", "settings")

    def __init__(
        self,
        settings: CacheSettings = DEFAULT_CACHE_SETTINGS,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if settings.max_hits < 0:
            raise ValueError(f"max_hits: must be >= 0, got {settings.max_hits!r}")
        if not settings.ttl_seconds > 0:
            raise ValueError(f"ttl_seconds: must be > 0, got {settings.ttl_seconds!r}")
        if settings.max_entries < 0:
            raise ValueError(f"max_entries: must be >= 0, got {settings.max_entries!r}")
        self.settings = settings
        self._clock = clock
        # The same entries twice: in order of last use (LRU eviction) and in order of
        # storing (expiry; one TTL for all, so the oldest store expires first). Made at
        # the first store: most runs in flight never cache anything.
        self._by_use: OrderedDict[str, _Entry] | None = None
        self._by_age: OrderedDict[str, _Entry] | None = None

    @property
    def enabled(self) -> bool:
        """False when ``max_entries == 0``: nothing is ever stored."""
        return self.settings.max_entries > 0

    def lookup(self, key: str) -> Lookup:
        """Find ``key`` and count a hit on it: ``miss``, ``hit`` (with the text) or ``loop``
        (the hit past ``max_hits``; the text is withheld)."""
        self._expire()
        entry = self._by_use.get(key) if self._by_use is not None else None
        if entry is None:
            return Lookup("miss")
        entry.hits += 1
        if entry.hits > self.settings.max_hits:
            return Lookup("loop", hits=entry.hits)
        self._by_use.move_to_end(key)  # type: ignore[union-attr]  # found in it
        return Lookup("hit", entry.content, entry.hits)

    def store(self, key: str, content: str) -> None:
        """Keep ``content`` for ``key`` (a fresh entry: TTL and hit count restart)."""
        if not self.enabled:
            return
        if self._by_use is None or self._by_age is None:
            self._by_use, self._by_age = OrderedDict(), OrderedDict()
        by_use, by_age = self._by_use, self._by_age
        if by_use.pop(key, None) is not None:
            del by_age[key]
        entry = _Entry(content, self._clock() + self.settings.ttl_seconds)
        by_use[key] = entry
        by_age[key] = entry
        self._expire()
        while len(by_use) > self.settings.max_entries:
            oldest, _ = by_use.popitem(last=False)
            del by_age[oldest]

    def clear(self) -> None:
        """Forget every entry (a call with side effects may have changed what they said)."""
        self._by_use = self._by_age = None

    def __len__(self) -> int:
        """Entries that have not expired."""
        self._expire()
        return len(self._by_use) if self._by_use is not None else 0

    def __contains__(self, key: object) -> bool:
        self._expire()
        return self._by_use is not None and key in self._by_use

    def _expire(self) -> None:
        by_use, by_age = self._by_use, self._by_age
        if not by_age or by_use is None:
            return
        now = self._clock()
        while by_age:
            key, entry = next(iter(by_age.items()))
            if entry.expires_at > now:
                return
            del by_age[key]
            del by_use[key]
