"""The AMQP 0-9-1 listener: ``AmqpServer(services)`` is started by the broker for the
``amqp`` role.  It owns the broker-wide AMQP state (state.py) and the connections' life cycle
(start, shutdown)."""

from __future__ import annotations

import asyncio
from typing import Any

from flowmq_broker.amqp.connection import AmqpConnection
from flowmq_broker.amqp.state import AmqpState
from flowmq_broker.listeners import listen
from flowmq_broker.services import BrokerServices
from flowmq_broker.tls import ServerTls
from flowmq_wire.amqp import constants as rc

_ADMIN_CLOSE = "CONNECTION_FORCED - closed by an administrator"


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
            lambda: AmqpConnection(shared),
            port,
            self.services.config.bind,
            reuse_port=self.services.config.reuse_port,
        )
        return bound

    async def start_tls(self, port: int, tls: ServerTls) -> int:
        """Serve AMQP over TLS (amqps) on ``port`` too, after ``start``; returns the bound
        port.  Logins are the same as on the plain port (the certificate names no user)."""
        shared = self.shared
        shared.tls = tls
        self._tls_server, bound = await listen(
            lambda: AmqpConnection(shared),
            port,
            self.services.config.bind,
            ssl=tls.context,
            reuse_port=self.services.config.reuse_port,
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

    # --- operations view (admin API: clients, kick) -----------------------------------------
    def clients(self) -> list[dict[str, Any]]:
        """Read only: this broker's AMQP connections, as ``GET /api/v1/clients`` shows them."""
        return [_client_view(conn, self.services.node_id) for conn in list(self.shared.connections)]

    def disconnect_client(self, connection_id: str) -> bool:
        """Close the connection ``connection_id`` (a view's ``id``) with 320
        CONNECTION_FORCED, as RabbitMQ's ``rabbitmqctl close_connection`` does."""
        for conn in list(self.shared.connections):
            if f"amqp:{conn.peer}" == connection_id:
                if conn.state == "opened":
                    conn.fail(rc.CONNECTION_FORCED, _ADMIN_CLOSE, 0)
                    conn.flush()
                else:
                    conn.abort()
                return True
        return False


def _client_view(conn: AmqpConnection, node_id: str) -> dict[str, Any]:
    queues: set[str] = set()
    unacked = 0
    for channel in list(conn.channels.values()):
        unacked += len(channel.consumers.unacked)
        for consumer in list(channel.consumers.by_tag.values()):
            queue = consumer.queue
            queues.add(queue if isinstance(queue, str) else queue.name)
    return {
        "id": f"amqp:{conn.peer}",
        "protocol": "amqp",
        "protocol_version": "0-9-1",
        "node_id": node_id,
        "address": conn.peer,
        "namespace": conn.namespace,
        "user": conn.username,
        "client_id": None,
        "connected": conn.state == "opened",
        "vhost": conn.vhost,
        "channels": len(conn.channels),
        "subscriptions": sorted(queues),
        "inflight": unacked,
    }
