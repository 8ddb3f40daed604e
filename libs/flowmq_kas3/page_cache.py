"""Byte-bounded LRU of object byte ranges (one entry per index chunk).

Filled by reads that missed and, write-through, by the batcher as soon as a chunk is
committed, so consumers tailing a stream read what was just produced without a GET.
Objects are immutable, so entries never go stale; a deleted object's entries just age out.
"""

from __future__ import annotations

import collections

from flowmq_metrics import kas3_page_cache_hit_count, kas3_page_cache_miss_count

RangeKey = tuple[str, int, int]
"""(object key, start, end)."""

DEFAULT_CACHE_BYTES = 64 * 1024 * 1024


class PageCache:
    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._entries: collections.OrderedDict[RangeKey, bytes | memoryview] = (
            collections.OrderedDict()
        )

    def get(self, key: RangeKey) -> bytes | memoryview | None:
        data = self._entries.get(key)
        if data is None:
            self.misses += 1
            kas3_page_cache_miss_count.inc()
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        kas3_page_cache_hit_count.inc()
        return data

    def put(self, key: RangeKey, data: bytes | memoryview) -> None:
        if len(data) > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.size -= len(old)
        self._entries[key] = data
        self.size += len(data)
        while self.size > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.size -= len(evicted)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.size = 0
