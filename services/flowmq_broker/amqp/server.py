"""The AMQP 0-9-1 listener: ``AmqpServer(services)`` is started by the broker for the
``amqp`` role.  It owns the broker-wide AMQP state (state.py) and the connections' life cycle
(start, shutdown)."""

from __future__ import annotations

import asyncio

from flowmq_broker.amqp.connection import AmqpConnection
from flowmq_broker.amqp.state import AmqpState
from flowmq_broker.listeners import listen
from flowmq_broker.services import BrokerServices


class AmqpServer:
    def __init__(self, services: BrokerServices) -> None:
        self.services = services
        self.shared = AmqpState(services)
        self._server: asyncio.Server | None = None

    async def start(self, port: int) -> int:
        shared = self.shared
        await shared.exchanges.load()
        self.services.sync.on_change.append(shared.exchanges.load)
        self._server, bound = await listen(
            lambda: AmqpConnection(shared), port, self.services.config.bind
        )
        return bound

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.shared.connections):
            conn.shutdown()
        await asyncio.sleep(0)
        for conn in list(self.shared.connections):
            conn.abort()
        if self._server is not None:
            await self._server.wait_closed()
        # Requeues of the closed channels are pending in the engine: persist them now.
        await self.shared.queues.stop()
