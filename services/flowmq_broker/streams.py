"""The Stream destination type: a routed message becomes a one-record Kafka v2 batch appended
to one partition of the Stream through the broker's group-commit batcher (DESIGN.md §5)."""

from __future__ import annotations

import asyncio
import itertools

from kafka.partitioner.default import murmur2

from flowmq_broker.routing import Binding, DestinationType, Router
from flowmq_core.message import Message
from flowmq_kas3.records import encode_message, message_summary
from flowmq_kas3.store import StreamStore
from flowmq_meta.catalog import STREAM


def partition_for(key: bytes | None, partitions: int, turn: int) -> int:
    """Kafka's default partitioner: murmur2 of the key, else round robin."""
    if key is None:
        return turn % partitions
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class StreamDestinationType(DestinationType):
    name = STREAM
    durable = True

    def __init__(self, store: StreamStore, router: Router) -> None:
        self.store = store
        self.router = router
        self._turns = itertools.count()

    def loaded(self, count: int) -> None:
        if count:
            self.store.batcher.warm_up()

    def accept(self, binding: Binding, message: Message) -> asyncio.Future[int]:
        dest = self.router.destination(binding)
        partitions = dest.options.get("partitions", 1) if dest is not None else 1
        partition = partition_for(message.key, partitions, next(self._turns))
        return self.store.append_nowait(
            binding.namespace,
            binding.name,
            partition,
            encode_message(message),
            summary=message_summary(message),
        )
