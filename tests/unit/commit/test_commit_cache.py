"""``ByteLRU``: byte accounting with a per-entry overhead, eviction order, discard."""

from __future__ import annotations

from flowmq_commit.cache import ByteLRU


class Cache(ByteLRU[str, str]):
    entry_overhead = 10

    def get(self, key: str) -> str | None:
        entry = self._entries.get(key)
        return None if entry is None else entry[0]


def test_entries_cost_size_plus_overhead_and_the_oldest_go_first() -> None:
    cache = Cache(100)
    cache.put("a", "A", 30)
    cache.put("b", "B", 30)
    assert cache.size == 80 and len(cache) == 2
    cache.put("c", "C", 30)  # 120 > 100: "a" goes
    assert cache.get("a") is None and cache.get("b") == "B" and cache.size == 80
    cache.put("b", "B2", 0)  # replacing re-counts the entry and makes it the newest
    assert cache.size == 50 and cache.get("b") == "B2"
    cache.put("d", "D", 45)  # 105 > 100: "c" goes, not the refreshed "b"
    assert cache.get("c") is None and cache.get("b") == "B2"


def test_too_big_entries_are_not_kept_and_discard_frees_bytes() -> None:
    cache = Cache(100)
    cache.put("huge", "H", 91)
    assert len(cache) == 0 and cache.size == 0
    cache.put("a", "A", 5)
    cache.discard("a")
    cache.discard("missing")
    assert len(cache) == 0 and cache.size == 0
    cache.put("b", "B", 5)
    cache.clear()
    assert len(cache) == 0 and cache.size == 0
