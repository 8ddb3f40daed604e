"""What an enqueue leaves in memory once durable: nothing the reference counts do not free
(no cycle waiting for a full collection), no cached body for a queue that is rarely read
back, and no metric series per queue for queues that share one label (MQTT sessions)."""

from __future__ import annotations

import gc

import pytest

import flowmq_metrics as metrics
from flowmq_core.message import Message
from flowmq_queue.enqueue import EnqueueCtx

pytestmark = pytest.mark.timeout(30)


def _live_contexts(prefix: bytes) -> int:
    return sum(
        isinstance(o, EnqueueCtx) and o.message is not None and o.message.payload.startswith(prefix)
        for o in gc.get_objects()
    )


async def test_a_durable_enqueue_is_freed_without_the_cyclic_collector(env) -> None:
    env.queue("q")
    gc.collect()
    gc.disable()  # only reference counts free memory from here on
    try:
        await env.publish("q", *[b"m%d" % i for i in range(200)])
        # Two more flushes: the batcher's task no longer holds the first one's chunks.
        await env.publish("q", b"next")
        await env.publish("q", b"next")
        assert _live_contexts(b"m") == 0
    finally:
        gc.enable()


async def test_a_queue_not_caching_bodies_leaves_the_cache_alone(env) -> None:
    env.queue("cached")
    env.queue("session", cache_bodies=False)
    cache = env.engine.parts.cache
    await env.publish("cached", b"a", b"b")
    assert len(cache) == 2
    await env.publish("session", *[b"s%d" % i for i in range(50)])
    assert len(cache) == 2
    peeked = await env.engine.peek("default", "session", 100)  # read back with a GET…
    assert [m.payload for _, _, m in peeked] == [b"s%d" % i for i in range(50)]
    assert len(cache) == 2  # …and not cached either


async def test_queues_sharing_a_metrics_label_add_no_series_per_queue(env) -> None:
    enqueued = metrics.queue_messages_enqueued_count
    before = enqueued.value("default", "$session")
    for client in range(5):
        opts = env.queue(f"$session/c{client}", metrics_label="$session")
        await env.engine.enqueue("default", f"$session/c{client}", Message("t", b"x"), opts)
    assert enqueued.value("default", "$session") == before + 5
    assert not any(values[1].startswith("$session/") for values in enqueued._children)
