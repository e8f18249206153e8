"""The per-run result cache on its own: hits and the loop, TTL, LRU bound, settings."""

from __future__ import annotations

import pytest

from actors.tools.cache import CacheSettings, Lookup, ResultCache


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _cache(clock: Clock | None = None, **settings: float) -> ResultCache:
    return ResultCache(CacheSettings(**settings), clock=clock or Clock())  # type: ignore[arg-type]


def test_miss_then_two_hits_then_the_loop() -> None:
    cache = _cache()
    assert cache.lookup("k") == Lookup("miss")
    cache.store("k", "A1001: delivered")
    assert cache.lookup("k") == Lookup("hit", "A1001: delivered", 1)
    assert cache.lookup("k") == Lookup("hit", "A1001: delivered", 2)
    loop = cache.lookup("k")
    assert loop == Lookup("loop", "", 3)  # the text is withheld
    assert cache.lookup("k").status == "loop"  # and stays a loop
    assert cache.lookup("other") == Lookup("miss")


@pytest.mark.parametrize(("max_hits", "hits_before_loop"), [(0, 0), (1, 1), (2, 2), (5, 5)])
def test_max_hits_is_the_number_of_hits_allowed(max_hits: int, hits_before_loop: int) -> None:
    cache = _cache(max_hits=max_hits)
    cache.store("k", "v")
    statuses = [cache.lookup("k").status for _ in range(hits_before_loop + 1)]
    assert statuses == ["hit"] * hits_before_loop + ["loop"]


def test_entries_expire_after_the_ttl_and_take_their_hit_count_with_them() -> None:
    clock = Clock()
    cache = _cache(clock, ttl_seconds=60.0, max_hits=2)
    cache.store("k", "old")
    assert cache.lookup("k").hits == 1
    assert cache.lookup("k").hits == 2
    clock.now += 59.9
    assert len(cache) == 1
    clock.now += 0.1  # exactly ttl_seconds after the store: gone
    assert len(cache) == 0
    assert "k" not in cache
    assert cache.lookup("k") == Lookup("miss")
    cache.store("k", "new")
    assert cache.lookup("k") == Lookup("hit", "new", 1)  # a fresh count, not a loop


def test_storing_again_refreshes_the_ttl() -> None:
    clock = Clock()
    cache = _cache(clock, ttl_seconds=10.0)
    cache.store("a", "1")
    cache.store("b", "2")
    clock.now += 8
    cache.store("a", "1 again")
    clock.now += 5  # b is 13 s old, a 5 s
    assert "b" not in cache
    assert cache.lookup("a") == Lookup("hit", "1 again", 1)


def test_the_least_recently_used_entry_is_evicted_past_max_entries() -> None:
    cache = _cache(max_entries=3)
    for key in "abc":
        cache.store(key, key.upper())
    assert cache.lookup("a").status == "hit"  # a is now the most recently used
    cache.store("d", "D")
    assert len(cache) == 3
    assert "b" not in cache  # the least recently used one went
    assert ["a" in cache, "c" in cache, "d" in cache] == [True, True, True]
    for key in "efgh":
        cache.store(key, key)
    assert len(cache) == 3
    assert [key for key in "acdefgh" if key in cache] == ["f", "g", "h"]


def test_max_entries_zero_turns_the_cache_off() -> None:
    cache = _cache(max_entries=0)
    assert not cache.enabled
    cache.store("k", "v")
    assert len(cache) == 0
    assert cache.lookup("k") == Lookup("miss")


def test_clear_forgets_entries_and_their_counts() -> None:
    cache = _cache(max_hits=1)
    cache.store("k", "v")
    assert cache.lookup("k").status == "hit"
    cache.clear()
    assert len(cache) == 0
    cache.store("k", "v")
    assert cache.lookup("k").status == "hit"


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"max_hits": -1}, "max_hits"),
        ({"ttl_seconds": 0.0}, "ttl_seconds"),
        ({"ttl_seconds": float("nan")}, "ttl_seconds"),
        ({"max_entries": -1}, "max_entries"),
    ],
)
def test_bad_settings_name_the_key(settings: dict[str, float], key: str) -> None:
    with pytest.raises(ValueError, match=f"^{key}: must be"):
        ResultCache(CacheSettings(**settings))  # type: ignore[arg-type]


def test_defaults_match_the_documented_ones() -> None:
    assert CacheSettings() == (2, 300.0, 256)
    assert ResultCache().settings == CacheSettings()
