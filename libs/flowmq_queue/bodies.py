"""Message bodies of queued messages: a byte-bounded LRU of decoded messages by location,
filled when this broker enqueues them (so local consumers never wait for a GET), and ranged
GETs for the rest (messages enqueued by other brokers, or evicted)."""

from __future__ import annotations

import collections

from flowmq_core.message import Message
from flowmq_objstore import ObjectStore
from flowmq_queue.codec import decode_message
from flowmq_queue.entries import Run

DEFAULT_CACHE_BYTES = 64 * 1024 * 1024
_ENTRY_OVERHEAD = 256  # a Message object and its dict entry, roughly

Location = tuple[str, int]  # (object key, byte offset)


class BodyCache:
    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._entries: collections.OrderedDict[Location, tuple[Message, int]] = (
            collections.OrderedDict()
        )

    def put(self, location: Location, message: Message, size: int) -> None:
        cost = size + _ENTRY_OVERHEAD
        if cost > self.max_bytes:
            return
        old = self._entries.pop(location, None)
        if old is not None:
            self.size -= old[1]
        self._entries[location] = (message, cost)
        self.size += cost
        while self.size > self.max_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.size -= evicted

    def get(self, location: Location) -> Message | None:
        hit = self._entries.get(location)
        if hit is None:
            self.misses += 1
            return None
        self.hits += 1
        return hit[0]

    def discard(self, location: Location) -> None:
        old = self._entries.pop(location, None)
        if old is not None:
            self.size -= old[1]

    def __len__(self) -> int:
        return len(self._entries)


async def load_run(objects: ObjectStore, cache: BodyCache, run: Run) -> list[Message]:
    """The messages of ``run``, from the cache or one ranged GET covering the missing ones."""
    out: list[Message | None] = []
    missing: list[int] = []
    for i, start in enumerate(run.starts):
        message = cache.get((run.object_key, start))
        out.append(message)
        if message is None:
            missing.append(i)
    if missing:
        lo = min(run.starts[i] for i in missing)
        hi = max(run.starts[i] + run.sizes[i] for i in missing)
        data = await objects.get(run.object_key, lo, hi)
        for i in missing:
            at = run.starts[i] - lo
            message = decode_message(data[at : at + run.sizes[i]])
            out[i] = message
            cache.put((run.object_key, run.starts[i]), message, run.sizes[i])
    return out  # type: ignore[return-value]
