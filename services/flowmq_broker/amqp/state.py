"""The broker-wide AMQP state, shared by every connection of this broker.

Owns: the exchange registry (exchanges clients declared, reloaded on catalog changes), the
memory queues (Subscriptions) and their destination type, which consumer holds a queue
exclusively, the cache of canonical publish topics, and the set of open connections — so that
a queue going away cancels its consumers on every connection.  Reaches the rest of the broker
only through ``BrokerServices``; sees connections only as ``Link``s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flowmq_broker.amqp.exchanges import ExchangeRegistry
from flowmq_broker.amqp.limits import AmqpLimits
from flowmq_broker.amqp.link import Link
from flowmq_broker.amqp.memqueue import MemConsumer, MemoryQueue, MemoryQueues
from flowmq_broker.queues import QueueService
from flowmq_broker.services import BrokerServices
from flowmq_broker.tls import ServerTls
from flowmq_core.errors import InvalidName, InvalidTopic
from flowmq_core.mapping import amqp_publish_topic

_TOPIC_CACHE_MAX = 100_000


class AmqpState:
    def __init__(self, services: BrokerServices) -> None:
        self.services = services
        self.router = services.router
        self.catalog = services.catalog
        self.allow_anonymous = bool(services.config.allow_anonymous)  # resolved: never None
        self.limits = AmqpLimits.from_config(services.config)
        self.queues: QueueService = services.queues
        self.exchanges = ExchangeRegistry(services.meta)
        self.memqueues = MemoryQueues(self.router)
        self.connections: set[Link] = set()
        # (namespace, queue) -> the consumer that consumes it exclusively.
        self.exclusive_consumers: dict[tuple[str, str], Any] = {}
        self._topics: dict[tuple[str, str, str], str | None] = {}
        # Channels with confirms to send (``Channel._schedule_confirms``): sent when the
        # batcher has told a flush's futures, right after their callbacks ran, instead of a
        # loop iteration later.
        self.confirms_due: set[Any] = set()
        self.queues.engine.parts.batcher.resolved_listeners.append(self.send_due_confirms)
        # The TLS settings once the amqps listener runs: a client certificate's CN may be the
        # login (SASL EXTERNAL, with tls_cert_as_username).
        self.tls: ServerTls | None = None

    def send_due_confirms(self) -> None:
        channels, self.confirms_due = self.confirms_due, set()
        for channel in channels:
            channel._send_confirms()

    def publish_topic(self, exchange: str, routing_key: str, exchange_type: str) -> str | None:
        """Canonical topic of a publish, None when no topic can express it (unroutable)."""
        key = (exchange, routing_key, exchange_type)
        topic = self._topics.get(key, "")
        if topic != "":
            return topic
        try:
            topic = amqp_publish_topic(exchange, routing_key, exchange_type)
        except (InvalidName, InvalidTopic):
            topic = None
        if len(self._topics) >= _TOPIC_CACHE_MAX:
            self._topics.clear()
        self._topics[key] = topic
        return topic

    def cancel_consumers_of(self, q: MemoryQueue) -> None:
        """The memory queue is going away: Basic.Cancel to every consumer of it."""
        self._cancel_where(lambda c: isinstance(c, MemConsumer) and c.queue is q)

    def cancel_consumers_of_durable(self, ns: str, name: str) -> None:
        """The Queue ``name`` of ``ns`` is going away: Basic.Cancel to every consumer of it."""
        self._cancel_where(lambda c: not isinstance(c, MemConsumer) and c.queue == name, ns)

    def _cancel_where(self, match: Callable[[Any], bool], ns: str | None = None) -> None:
        """Cancel (and tell the client of) every consumer ``match`` picks, only on connections
        to ``ns`` if given."""
        for conn in list(self.connections):
            if ns is not None and conn.namespace != ns:
                continue
            conn.cancel_consumers(match)
