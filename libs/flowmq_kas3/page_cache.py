"""Byte-bounded LRU of object byte ranges (one entry per index chunk).

Filled by reads that missed and, write-through, by the batcher as soon as a chunk is
committed, so consumers tailing a stream read what was just produced without a GET.
Objects are immutable, so entries never go stale; a deleted object's entries just age out.
"""

from __future__ import annotations

from flowmq_commit.cache import ByteLRU
from flowmq_metrics import kas3_page_cache_hit_count, kas3_page_cache_miss_count

RangeKey = tuple[str, int, int]
"""(object key, start, end)."""


class PageCache(ByteLRU[RangeKey, bytes | memoryview]):
    """``put(key, data, len(data))``; a hit makes the entry the most recently used."""

    def get(self, key: RangeKey) -> bytes | memoryview | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            kas3_page_cache_miss_count.inc()
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        kas3_page_cache_hit_count.inc()
        return entry[0]
