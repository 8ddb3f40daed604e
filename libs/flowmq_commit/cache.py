"""``ByteLRU``: the byte-bounded LRU under this broker's caches of stored bytes — the stream
page cache (``flowmq_kas3.page_cache``) and the queue body cache (``flowmq_queue.bodies``).

Both are filled write-through as soon as a flush commits (so local consumers read what was
just written without a GET) and by reads that missed.  Objects are immutable, so an entry
never goes stale; the entries of a deleted object just age out.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

DEFAULT_CACHE_BYTES = 64 * 1024 * 1024


class ByteLRU(Generic[K, V]):
    """Entries cost their ``size`` plus ``entry_overhead`` bytes; past ``max_bytes`` the
    least recently put (or touched, by a subclass's ``get``) go first.  An entry that alone
    exceeds ``max_bytes`` is not kept.  Subclasses define ``get``: whether a hit refreshes
    the entry and what it counts are theirs."""

    entry_overhead = 0

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._entries: collections.OrderedDict[K, tuple[V, int]] = collections.OrderedDict()

    def put(self, key: K, value: V, size: int) -> None:
        cost = size + self.entry_overhead
        if cost > self.max_bytes:
            return
        entries = self._entries
        old = entries.pop(key, None)
        if old is not None:
            self.size -= old[1]
        entries[key] = (value, cost)
        self.size += cost
        while self.size > self.max_bytes:
            _, (_, evicted) = entries.popitem(last=False)
            self.size -= evicted

    def discard(self, key: K) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.size -= old[1]

    def clear(self) -> None:
        self._entries.clear()
        self.size = 0

    def __len__(self) -> int:
        return len(self._entries)
