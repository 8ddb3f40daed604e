"""flowmq_queue: Queue storage (DESIGN.md §5 Queue) — competing consumers, at-least-once.

- ``QueueEngine`` (engine.py): enqueue through the shared batcher, the consumer API, dead
  letters, whole-queue operations, the reaper.
- claims.py: ``ClaimRounds`` batches claims / acks / requeues / lease renewals into rounds of
  one transaction each (round_txn.py: a round's transaction); consumers.py: ``Consumer``,
  ``Delivery``, leases.
- index.py: the transaction-level operations on the meta-store index; entries.py: the run
  format of an index entry; enqueue.py: the batcher commit; codec.py: stored bodies;
  bodies.py: body cache and ranged reads.
"""

from __future__ import annotations

from flowmq_queue.bodies import BodyCache
from flowmq_queue.codec import decode_message, encode_message
from flowmq_queue.consumers import Consumer, Delivery
from flowmq_queue.engine import DEFAULT_LEASE_MS, QueueEngine
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
