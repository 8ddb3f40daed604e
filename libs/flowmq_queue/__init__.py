"""flowmq_queue: Queue storage (DESIGN.md §5 Queue) — competing consumers, at-least-once.

- ``QueueEngine`` (engine.py): enqueue through the shared batcher, consumers with prefetch,
  claims / acks / requeues / lease renewals batched into rounds, dead letters, the reaper.
- index.py: the transaction-level operations on the meta-store index; entries.py: the run
  format of an index entry; enqueue.py: the batcher commit; codec.py: stored bodies;
  bodies.py: body cache and ranged reads.
"""

from __future__ import annotations

from flowmq_queue.bodies import BodyCache
from flowmq_queue.codec import decode_message, encode_message
from flowmq_queue.engine import DEFAULT_LEASE_MS, Consumer, Delivery, QueueEngine
from flowmq_queue.errors import QueueError, QueueFull, QueueGone
from flowmq_queue.index import QueueOptions

__all__ = [
    "DEFAULT_LEASE_MS",
    "BodyCache",
    "Consumer",
    "Delivery",
    "QueueEngine",
    "QueueError",
    "QueueFull",
    "QueueGone",
    "QueueOptions",
    "decode_message",
    "encode_message",
]
