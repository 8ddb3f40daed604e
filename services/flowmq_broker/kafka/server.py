"""The Kafka listener (role ``kafka``): ``KafkaServer(services)``, ``await start(port)``,
``await stop()``.

Kafka topics are the Streams of the connection's namespace: its user's, ``default`` for an
anonymous client (``tenants.py``).  Produced record batches go to ``services.streams`` as
they are and, when other destinations match the topic's canonical name, through the router
to them as well (DESIGN.md §3).  The API table below is exactly what ApiVersions advertises.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import flowmq_metrics as metrics
from flowmq_broker.kafka import fetch, groups, metadata, offsets, produce, sasl, topic_admin
from flowmq_broker.kafka.cluster import ClusterView
from flowmq_broker.kafka.connection import ApiSpec, KafkaConnection
from flowmq_broker.kafka.context import Handler
from flowmq_broker.kafka.coordinator import Group
from flowmq_broker.kafka.idempotence import ProducerStates
from flowmq_broker.kafka.tenants import Tenants
from flowmq_broker.listeners import listen
from flowmq_broker.services import BrokerServices
from flowmq_broker.tls import ServerTls
from flowmq_meta.group_offsets import GroupOffsetStore
from flowmq_wire.kafka import API_NAMES, FrameSplitter, api_name

log = logging.getLogger(__name__)


# (api key, min, max, handler).  Maxima stop before versions that address topics by id
# only (Produce 13, Fetch 13, OffsetCommit/OffsetFetch 10) or need transactions.
API_TABLE: list[tuple[int, int, int, Handler]] = [
    (0, 3, 12, produce.handle_produce),
    (1, 4, 12, fetch.handle_fetch),
    (2, 1, 6, fetch.handle_list_offsets),
    (3, 0, 12, metadata.handle_metadata),
    (8, 2, 9, offsets.handle_offset_commit),
    (9, 1, 9, offsets.handle_offset_fetch),
    (10, 0, 4, metadata.handle_find_coordinator),
    (11, 0, 9, groups.handle_join_group),
    (12, 0, 4, groups.handle_heartbeat),
    (13, 0, 5, groups.handle_leave_group),
    (14, 0, 5, groups.handle_sync_group),
    (15, 0, 5, groups.handle_describe_groups),
    (16, 0, 4, groups.handle_list_groups),
    (17, 0, 1, sasl.handle_sasl_handshake),
    (18, 0, 4, metadata.handle_api_versions),
    (19, 2, 7, topic_admin.handle_create_topics),
    (20, 1, 6, topic_admin.handle_delete_topics),
    (22, 0, 5, produce.handle_init_producer_id),
    (32, 1, 4, metadata.handle_describe_configs),
    (36, 0, 2, sasl.handle_sasl_authenticate),
    (37, 0, 3, topic_admin.handle_create_partitions),
    (42, 0, 2, groups.handle_delete_groups),
    (60, 0, 1, metadata.handle_describe_cluster),
]


class KafkaServer:
    def __init__(self, services: BrokerServices, *, max_request_size: int | None = None) -> None:
        self.services = services
        config = services.config
        self.max_request_size = max_request_size or config.kafka_max_request_bytes
        self.max_message_bytes = config.kafka_message_max_bytes
        self.max_fetch_bytes = config.kafka_fetch_max_bytes
        self.idle_timeout = config.kafka_idle_timeout
        self._idle_sweep: asyncio.TimerHandle | None = None
        self.allow_anonymous = bool(config.allow_anonymous)  # resolved: never None
        self.cluster = ClusterView(
            services.node_id, services.nodes, advertised_host=config.advertised_host
        )
        self.offsets = GroupOffsetStore(services.meta)
        self.tenants = Tenants(services, self._forget_topic, self.offsets)
        self.producers = ProducerStates(services.meta)
        self.apis: dict[int, ApiSpec] = {
            key: ApiSpec(key, low, high, handler) for key, low, high, handler in API_TABLE
        }
        self.supported = [(s.key, s.min_version, s.max_version) for s in self.apis.values()]
        self.connections: set[KafkaConnection] = set()
        self._request_counters: dict[int, Any] = {}
        self._server: asyncio.base_events.Server | None = None
        self._tls_server: asyncio.base_events.Server | None = None
        # Host mode: the listeners on the shared ports, beside the advertised ones (``_listen``).
        self._shared_servers: list[asyncio.base_events.Server] = []
        self.tls: ServerTls | None = None
        self.port = 0

    # -- life cycle --------------------------------------------------------------------------

    async def start(self, port: int) -> int:
        """Serve on ``port``; returns the port Metadata advertises for this broker."""
        self._server, self.port = await self._listen(port)
        self.cluster.start(self.port)
        if self.idle_timeout > 0:
            self._schedule_idle_sweep()
        return self.port

    async def start_tls(self, port: int, tls: ServerTls) -> int:
        """Serve Kafka's SSL and SASL_SSL security protocols on ``port`` too (after
        ``start``); Metadata then tells TLS clients the brokers' TLS ports."""
        self.tls = tls
        self._tls_server, bound = await self._listen(port, tls)
        self.cluster.set_tls_port(bound)
        return bound

    async def _listen(
        self, port: int, tls: ServerTls | None = None
    ) -> tuple[asyncio.base_events.Server, int]:
        """Listen on ``port``; returns the server and the port to advertise.

        In host mode (``reuse_port``, DESIGN.md §14) ``port`` is shared by the host's
        processes, and a connection to it lands on any of them; but a Kafka client routes
        by broker (partition leader, group coordinator: ``cluster.py``) and keeps one
        connection per broker, so a group's requests could reach a process that does not
        coordinate it, again and again.  Each process therefore also listens on a port of
        its own (any free one) and advertises that: clients bootstrap through the shared
        port and then reach every process directly, as brokers of a cluster."""
        config = self.services.config
        ssl = tls.context if tls is not None else None
        server, bound = await listen(
            lambda: KafkaConnection(self), port, config.bind, ssl=ssl, reuse_port=config.reuse_port
        )
        if not config.reuse_port:
            return server, bound
        self._shared_servers.append(server)  # stopped with the others
        return await listen(lambda: KafkaConnection(self), 0, config.bind, ssl=ssl)

    async def stop(self) -> None:
        if self._idle_sweep is not None:
            self._idle_sweep.cancel()
        servers = [s for s in (self._server, self._tls_server) if s is not None]
        servers += self._shared_servers
        for server in servers:
            server.close()
        for conn in list(self.connections):
            conn.close()
        self.tenants.shutdown()
        await self.cluster.stop()
        await self.offsets.close()
        for server in servers:
            await server.wait_closed()

    def _schedule_idle_sweep(self) -> None:
        # One timer for the listener, not one per connection: a connection is closed between
        # idle_timeout and idle_timeout + a quarter of it (at most 30 s) after its last read.
        interval = min(self.idle_timeout / 4, 30.0)
        self._idle_sweep = asyncio.get_running_loop().call_later(interval, self._sweep_idle)

    def _sweep_idle(self) -> None:
        now = asyncio.get_running_loop().time()
        for conn in list(self.connections):
            if not conn.closing and conn.idle_for(now) > self.idle_timeout:
                conn.close_idle(self.idle_timeout)
        self._schedule_idle_sweep()

    # -- shared helpers for handlers and connections -------------------------------------------

    def new_splitter(self) -> FrameSplitter:
        return FrameSplitter(self.max_request_size)

    def count_request(self, api_key: int) -> None:
        counter = self._request_counters.get(api_key)
        if counter is None:
            # One "Unknown" label for keys no Kafka defines: a fuzzer must not be able to
            # create a metric series per random key.
            name = api_name(api_key) if api_key in API_NAMES else "Unknown"
            counter = metrics.kafka_requests_count.labels(name)
            if api_key in API_NAMES:
                self._request_counters[api_key] = counter
        counter.inc()

    def update_stream_subscriptions(self) -> None:
        """``broker_stream_subscriptions``: connections of this broker that fetch."""
        metrics.broker_stream_subscriptions.set(sum(1 for c in self.connections if c.fetching))

    def owns_group(self, group_id: str) -> bool:
        """Placement hashes the group id alone: one broker coordinates a group id in every
        namespace, each namespace's group apart (``tenants.py``)."""
        return self.cluster.is_local(self.cluster.coordinator(group_id))

    # -- operations view (admin API: consumer groups) -----------------------------------------

    def live_group(self, namespace: str, group_id: str) -> Group | None:
        """The in-memory state of group (``namespace``, ``group_id``) if this broker has it."""
        tenant = self.tenants.find(namespace)
        return None if tenant is None else tenant.coordinator.describe(group_id)

    def live_group_ids(self, namespace: str) -> list[str]:
        """The groups of ``namespace`` this broker coordinates and keeps in memory."""
        tenant = self.tenants.find(namespace)
        return [] if tenant is None else list(tenant.coordinator.groups)

    # -- operations view (admin API: clients, kick) -----------------------------------------

    def clients(self) -> list[dict[str, Any]]:
        """Read only: this broker's Kafka connections, as ``GET /api/v1/clients`` shows them
        (Kafka sends its client id per request, so none is kept per connection)."""
        return [
            {
                "id": f"kafka:{conn.peer}",
                "protocol": "kafka",
                "protocol_version": None,
                "node_id": self.services.node_id,
                "address": conn.peer,
                "namespace": conn.tenant.namespace,
                "user": conn.user,
                "client_id": None,
                "connected": not conn.closing,
                "fetching": conn.fetching,
                "subscriptions": [],
                "inflight": None,
            }
            for conn in list(self.connections)
        ]

    def disconnect_client(self, connection_id: str) -> bool:
        """Close the connection ``connection_id`` (a view's ``id``); Kafka has no message
        for it, so the client sees the socket close and reconnects (or not)."""
        for conn in list(self.connections):
            if f"kafka:{conn.peer}" == connection_id:
                conn.close()
                return True
        return False

    async def _forget_topic(self, namespace: str, name: str) -> None:
        await self.offsets.delete_stream(namespace, name)
        await self.producers.forget_stream(namespace, name)


__all__ = ["API_TABLE", "ApiSpec", "KafkaServer"]
