"""The AMQP 0-9-1 listener: ``AmqpServer(services)`` is started by the broker for the
``amqp`` role.  It owns the broker-wide AMQP state (state.py) and the connections' life cycle
(start, shutdown)."""

from __future__ import annotations

import asyncio

from flowmq_broker.amqp.connection import AmqpConnection
from flowmq_broker.amqp.state import AmqpState
from flowmq_broker.listeners import listen
from flowmq_broker.services import BrokerServices
from flowmq_broker.tls import ServerTls


class AmqpServer:
    def __init__(self, services: BrokerServices) -> None:
        self.services = services
        self.shared = AmqpState(services)
        self._server: asyncio.Server | None = None
        self._tls_server: asyncio.Server | None = None

    async def start(self, port: int) -> int:
        shared = self.shared
        await shared.exchanges.load()
        self.services.sync.on_change.append(shared.exchanges.load)
        self._server, bound = await listen(
            lambda: AmqpConnection(shared), port, self.services.config.bind
        )
        return bound

    async def start_tls(self, port: int, tls: ServerTls) -> int:
        """Serve AMQP over TLS (amqps) on ``port`` too, after ``start``; returns the bound
        port.  Logins are the same as on the plain port (the certificate names no user)."""
        shared = self.shared
        self._tls_server, bound = await listen(
            lambda: AmqpConnection(shared), port, self.services.config.bind, ssl=tls.context
        )
        return bound

    async def stop(self) -> None:
        servers = [s for s in (self._server, self._tls_server) if s is not None]
        for server in servers:
            server.close()
        for conn in list(self.shared.connections):
            conn.shutdown()
        await asyncio.sleep(0)
        for conn in list(self.shared.connections):
            conn.abort()
        for server in servers:
            await server.wait_closed()
        # Requeues of the closed channels are pending in the engine: persist them now.
        await self.shared.queues.stop()
