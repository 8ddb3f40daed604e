"""Exclusive and auto-delete AMQP queues: Subscriptions (DESIGN.md §5) — memory push to the
consumers of this broker, nothing stored, gone with their connection (exclusive) or their
last consumer (auto-delete)."""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

from flowmq_broker.routing import Binding, DestinationType, Router
from flowmq_core.message import Message
from flowmq_queue.consumers import DEFAULT_WINDOW

SUBSCRIPTION = "amqp-subscription"
# Messages kept for a queue whose consumers have no credit; beyond it the oldest are dropped
# (a Subscription is not durable storage).
MAX_BUFFERED = 100_000


@dataclasses.dataclass(slots=True, eq=False)
class MemConsumer:
    queue: MemoryQueue
    tag: str
    deliver: Callable[[MemConsumer, list[tuple[Message, bool]]], None]
    prefetch: int
    no_ack: bool
    unacked: int = 0
    active: bool = True
    paused: bool = False

    def credit(self) -> int:
        if not self.active or self.paused:
            return 0
        if self.no_ack:
            return DEFAULT_WINDOW
        return max(0, (self.prefetch or DEFAULT_WINDOW) - self.unacked)


class MemoryQueue:
    def __init__(
        self,
        ns: str,
        name: str,
        owner: Any,
        *,
        exclusive: bool,
        auto_delete: bool,
        durable: bool,
        arguments: dict[str, Any],
    ) -> None:
        self.ns = ns
        self.name = name
        self.owner = owner  # the connection of an exclusive queue
        self.exclusive = exclusive
        self.auto_delete = auto_delete
        self.durable = durable
        self.arguments = arguments
        self.binding = Binding(SUBSCRIPTION, ns, name)
        self.filters: set[str] = set()
        self.consumers: list[MemConsumer] = []
        self.buffer: collections.deque[tuple[Message, bool]] = collections.deque()
        self.had_consumer = False
        self.deleted = False
        self._turn = itertools.count()

    def push(self, message: Message, redelivered: bool = False) -> None:
        if self.buffer or not self._deliver_one(message, redelivered):
            if len(self.buffer) >= MAX_BUFFERED:
                self.buffer.popleft()
            self.buffer.append((message, redelivered))

    def _deliver_one(self, message: Message, redelivered: bool) -> bool:
        consumers = self.consumers
        n = len(consumers)
        if not n:
            return False
        start = next(self._turn)
        for i in range(n):
            c = consumers[(start + i) % n]
            if c.credit() > 0:
                if not c.no_ack:
                    c.unacked += 1
                c.deliver(c, [(message, redelivered)])
                return True
        return False

    def pump(self) -> None:
        """Hand buffered messages to consumers with credit."""
        buffer = self.buffer
        while buffer:
            progressed = False
            for c in list(self.consumers):
                credit = c.credit()
                if credit <= 0:
                    continue
                batch = []
                while buffer and len(batch) < credit:
                    batch.append(buffer.popleft())
                if not batch:
                    break
                if not c.no_ack:
                    c.unacked += len(batch)
                c.deliver(c, batch)
                progressed = True
            if not progressed:
                return

    def add_consumer(self, consumer: MemConsumer) -> None:
        self.consumers.append(consumer)
        self.had_consumer = True
        self.pump()

    def remove_consumer(self, consumer: MemConsumer) -> None:
        consumer.active = False
        if consumer in self.consumers:
            self.consumers.remove(consumer)

    def settled(self, consumer: MemConsumer, message: Message, requeue: bool | None) -> None:
        """An unacked delivery was acked (None), rejected (False) or requeued (True)."""
        if consumer.unacked > 0:
            consumer.unacked -= 1
        if requeue:
            self.buffer.appendleft((message, True))
        self.pump()

    def purge(self) -> int:
        n = len(self.buffer)
        self.buffer.clear()
        return n


class MemoryQueues(DestinationType):
    """The registry of this broker's memory queues, and their destination type."""

    name = SUBSCRIPTION
    durable = False

    def __init__(self, router: Router) -> None:
        self.router = router
        self.queues: dict[tuple[str, str], MemoryQueue] = {}
        router.register_type(self)

    def accept(self, binding: Binding, message: Message) -> None:
        q = self.queues.get((binding.namespace, binding.name))
        if q is not None:
            if message.is_expired():
                return None
            q.push(message)
        return None

    def get(self, ns: str, name: str) -> MemoryQueue | None:
        return self.queues.get((ns, name))

    def add(self, q: MemoryQueue, implicit_filter: str) -> None:
        self.queues[(q.ns, q.name)] = q
        self.bind(q, implicit_filter)

    def bind(self, q: MemoryQueue, topic_filter: str) -> None:
        if topic_filter not in q.filters:
            q.filters.add(topic_filter)
            self.router.bind(q.binding, topic_filter)

    def unbind(self, q: MemoryQueue, topic_filter: str) -> None:
        if topic_filter in q.filters:
            q.filters.discard(topic_filter)
            self.router.unbind(q.binding, topic_filter)

    def delete(self, q: MemoryQueue) -> int:
        if q.deleted:
            return 0
        q.deleted = True
        for topic_filter in list(q.filters):
            self.unbind(q, topic_filter)
        if self.queues.get((q.ns, q.name)) is q:
            del self.queues[(q.ns, q.name)]
        for c in q.consumers:
            c.active = False
        return q.purge()
