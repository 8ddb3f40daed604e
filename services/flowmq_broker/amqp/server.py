"""The AMQP 0-9-1 listener and the broker-wide AMQP state (exchanges, memory queues).

``AmqpServer(services)`` is started by the broker for the ``amqp`` role.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from pamqp import commands

from flowmq_broker.amqp.connection import AmqpConnection
from flowmq_broker.amqp.exchanges import ExchangeRegistry
from flowmq_broker.amqp.memqueue import MemConsumer, MemoryQueue, MemoryQueues
from flowmq_broker.listeners import listen
from flowmq_broker.queues import QueueService
from flowmq_broker.services import BrokerServices
from flowmq_core.errors import InvalidName, InvalidTopic
from flowmq_core.mapping import amqp_publish_topic
from flowmq_wire.amqp.methods import encode_method

log = logging.getLogger(__name__)

_TOPIC_CACHE_MAX = 100_000


class AmqpServer:
    def __init__(self, services: BrokerServices) -> None:
        self.services = services
        self.router = services.router
        self.catalog = services.catalog
        self.allow_anonymous = services.config.allow_anonymous
        self.queues: QueueService = services.queues
        self.exchanges = ExchangeRegistry(services.meta)
        self.memqueues = MemoryQueues(self.router)
        self.connections: set[AmqpConnection] = set()
        self.exclusive_consumers: dict[tuple[str, str], Any] = {}
        self._topics: dict[tuple[str, str, str], str | None] = {}
        self._server: asyncio.Server | None = None

    async def start(self, port: int) -> int:
        await self.exchanges.load()
        self.services.sync.on_change.append(self.exchanges.load)
        self._server, bound = await listen(lambda: AmqpConnection(self), port)
        return bound

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.shutdown()
        await asyncio.sleep(0)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()
        # Requeues of the closed channels are pending in the engine: persist them now.
        await self.queues.stop()

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
            for channel in list(conn.channels.values()):
                for tag, c in list(channel.consumers.items()):
                    if match(c):
                        channel.cancel_consumer(tag)
                        channel.conn.send(
                            encode_method(channel.number, commands.Basic.Cancel(tag, True))
                        )
