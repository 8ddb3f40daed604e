"""Message bodies of queued messages: a byte-bounded LRU of decoded messages by location,
filled when this broker enqueues them (so local consumers never wait for a GET), and ranged
GETs for the rest (messages enqueued by other brokers, or evicted)."""

from __future__ import annotations

from flowmq_commit.cache import ByteLRU
from flowmq_core.message import Message
from flowmq_objstore import ObjectStore
from flowmq_queue.codec import decode_message
from flowmq_queue.entries import Run

# What a cached message costs beyond its stored size: the Message, its list and dict, the
# location tuple and the LRU's entry.  Measured (RSS) for a 10-byte MQTT message: ~830 bytes
# of which 37 stored.  With 256 the 64 MiB budget let small messages pin ~200 MiB.
_ENTRY_OVERHEAD = 768

Location = tuple[str, int]  # (object key, byte offset)


class BodyCache(ByteLRU[Location, Message]):
    """``put(location, message, stored size)``; a hit does not refresh the entry: a body is
    read when claimed and dropped when acknowledged."""

    entry_overhead = _ENTRY_OVERHEAD

    def get(self, location: Location) -> Message | None:
        hit = self._entries.get(location)
        if hit is None:
            self.misses += 1
            return None
        self.hits += 1
        return hit[0]


async def load_run(
    objects: ObjectStore, cache: BodyCache, run: Run, *, fill: bool = True
) -> list[Message]:
    """The messages of ``run``, from the cache or one ranged GET covering the missing ones
    (put into the cache unless not to ``fill`` it: a queue that is rarely read back)."""
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
            if fill:
                cache.put((run.object_key, run.starts[i]), message, run.sizes[i])
    return out  # type: ignore[return-value]
