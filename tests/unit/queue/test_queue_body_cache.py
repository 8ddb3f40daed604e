"""The body cache's byte budget bounds the memory it really holds, small messages included."""

from __future__ import annotations

import tracemalloc

from flowmq_core.message import Message
from flowmq_queue.bodies import BodyCache
from flowmq_queue.codec import encode_message

BUDGET = 2 * 1024 * 1024


def test_small_messages_stay_within_the_byte_budget() -> None:
    cache = BodyCache(BUDGET)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(40_000):  # far more than fit: the cache must evict
            message = Message("fz/b/c", i.to_bytes(10, "big"), 1, properties={})
            stored_size = len(encode_message(message))
            cache.put((f"queues/default/obj-{i // 100:08d}", i * 40), message, stored_size)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache.size <= BUDGET
    assert held <= BUDGET * 1.1, f"{held} bytes held for a budget of {BUDGET}"
