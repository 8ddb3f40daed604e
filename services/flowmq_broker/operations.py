"""The broker's side of the admin API's operations endpoints (DESIGN.md §9): readiness,
live counts, stream and queue reads, consumer groups, client connections.

``OperationsBackend`` is a part of ``Broker`` (server.py), which sets the attributes below
in ``start``; it only reads and delegates: counts and reads to ``LiveViews`` (live.py),
groups to ``GroupAdmin`` (group_admin.py), readiness to ``Readiness`` (readiness.py), and
clients to each protocol adapter's read-only ``clients()`` and ``disconnect_client()``.
"""

from __future__ import annotations

from typing import Any

from flowmq_admin.handlers import StreamRead
from flowmq_broker.group_admin import GroupAdmin
from flowmq_broker.live import LiveViews
from flowmq_broker.queues import QueueService
from flowmq_broker.readiness import Readiness
from flowmq_cluster import Gossip
from flowmq_meta.catalog import Destination

CLIENT_PROTOCOLS = ("mqtt", "amqp", "kafka")  # adapters with client connections


class OperationsBackend:
    node_id: str
    adapters: dict[str, Any]
    gossip: Gossip | None
    queues: QueueService | None
    live: LiveViews | None
    group_admin: GroupAdmin | None
    readiness: Readiness | None
    stopping: bool

    async def readiness_checks(self) -> dict[str, dict[str, Any]]:
        assert self.readiness is not None
        return await self.readiness.checks()

    def _cluster_state(self) -> tuple[str | None, dict[str, Any]]:
        if self.stopping:
            return "the broker is stopping", {}
        if self.gossip is None:
            return "gossip is not running", {}
        return None, {"members": self.gossip.cluster_size}

    async def stream_counts(self, dest: Destination) -> dict[str, Any]:
        assert self.live is not None
        partitions = int(dest.options.get("partitions", 1))
        return await self.live.stream_counts(dest.namespace, dest.name, partitions)

    async def queue_counts(self, dest: Destination) -> dict[str, Any]:
        assert self.live is not None
        return await self.live.queue_counts(dest.namespace, dest.name)

    async def read_stream(self, read: StreamRead) -> dict[str, Any]:
        assert self.live is not None
        return await self.live.read_stream(
            read.namespace, read.name, read.partition, read.offset, read.limit, read.wait_ms
        )

    async def peek_queue(self, namespace: str, name: str, limit: int) -> list[dict[str, Any]]:
        assert self.queues is not None
        found = await self.queues.engine.peek(namespace, name, limit)
        return [{"seq": seq, "redelivered": attempt > 0, "message": m} for seq, attempt, m in found]

    async def take_from_queue(self, namespace: str, name: str, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` messages taken off the queue for good (Basic.Get with no-ack)."""
        assert self.queues is not None
        taken = []
        for _ in range(limit):
            delivery, _left = await self.queues.engine.get(namespace, name, no_ack=True)
            if delivery is None:
                break
            taken.append(
                {
                    "seq": delivery.seq,
                    "redelivered": delivery.redelivered,
                    "message": delivery.message,
                }
            )
        return taken

    async def purge_queue(self, namespace: str, name: str) -> int:
        assert self.queues is not None
        return await self.queues.engine.purge(namespace, name)

    async def groups(self, namespace: str) -> list[dict[str, Any]]:
        assert self.group_admin is not None
        return await self.group_admin.list(namespace)

    async def group(self, namespace: str, group: str) -> dict[str, Any]:
        assert self.group_admin is not None
        return await self.group_admin.describe(namespace, group)

    async def reset_group_offsets(
        self, namespace: str, group: str, stream: str, to: str | int, partition: int | None
    ) -> dict[str, Any]:
        assert self.group_admin is not None
        return await self.group_admin.reset(namespace, group, stream, to, partition)

    def clients(self) -> list[dict[str, Any]]:
        """Every client connection of this broker, MQTT, AMQP and Kafka."""
        found: list[dict[str, Any]] = []
        for role in CLIENT_PROTOCOLS:
            adapter = self.adapters.get(role)
            if adapter is not None:
                found.extend(adapter.clients())
        return found

    def disconnect_client(self, connection_id: str) -> bool:
        protocol = connection_id.partition(":")[0]
        adapter = self.adapters.get(protocol) if protocol in CLIENT_PROTOCOLS else None
        return adapter is not None and adapter.disconnect_client(connection_id)
