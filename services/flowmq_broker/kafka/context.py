"""What a Kafka API handler is given: ``RequestContext`` (STYLE.md, the Redpanda shape: one
handler per API, each taking a request context), and the two small views it may use of the
listener and of the client's connection.

The adapter's modules import in one direction only (no cycle, also none under
``TYPE_CHECKING``):

    flowmq_wire.kafka (codec)
      → state: topics, cluster, coordinator, idempotence, sasl_exchange
      → tenants (one namespace's topics and groups), then context
      → handlers: produce, fetch, metadata, groups, offsets, sasl, topic_admin
      → connection (one client's I/O, dispatch by ``ApiSpec``)
      → server (the listener: builds the state and the API table)

``ServerState`` and ``ConnectionState`` are ``Protocol``s that ``KafkaServer`` and
``KafkaConnection`` satisfy, so a handler reads the listener's state without importing the
modules above it.  A context is built per request and holds references only: no copy, no
await.  ``ctx.tenant`` is the connection's namespace (``tenants.KafkaTenant``): its topics,
groups and namespace name, the only ones a handler may touch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from flowmq_broker.kafka.cluster import ClusterView
from flowmq_broker.kafka.idempotence import ProducerStates
from flowmq_broker.kafka.sasl_exchange import SaslExchange
from flowmq_broker.kafka.tenants import KafkaTenant, Tenants
from flowmq_broker.services import BrokerServices
from flowmq_core.acl import Access
from flowmq_meta.group_offsets import GroupOffsetStore
from flowmq_wire.kafka import RequestHeader, response_class


class ServerState(Protocol):
    """What handlers use of the Kafka listener: the state it shares among connections."""

    services: BrokerServices
    max_request_size: int
    max_message_bytes: int  # message.max.bytes: the largest record batch a Produce may carry
    max_fetch_bytes: int  # fetch.max.bytes: the most a Fetch answers (beyond one batch)
    # (api key, min version, max version) for every API served: what ApiVersions lists.
    supported: list[tuple[int, int, int]]
    cluster: ClusterView
    tenants: Tenants
    offsets: GroupOffsetStore  # keyed by namespace: pass ``ctx.tenant.namespace``
    producers: ProducerStates  # keyed by namespace too

    def owns_group(self, group_id: str) -> bool:
        """Whether this broker coordinates ``group_id`` (else NOT_COORDINATOR)."""
        ...

    def update_stream_subscriptions(self) -> None:
        """Recount the connections that fetch (``broker_stream_subscriptions``)."""
        ...


class ConnectionState(Protocol):
    """What handlers use of the client's connection: its session state and its close."""

    peer: str
    local_host: str  # the address the client reached us on
    tls: bool  # it reached us on the TLS listener (SSL, SASL_SSL)
    client_host: str  # "/<client address>", as Kafka shows members
    client_address: str  # the client's IP address (failed logins are counted against it)
    user: str | None  # once authenticated
    tenant: KafkaTenant  # the user's namespace (``default`` until authenticated)
    access: Access  # what it may do (flowmq_core.acl): the user's, or anonymous
    sasl: SaslExchange | None  # from SaslHandshake on
    sasl_raw_next: bool  # SaslHandshake v0: the next frames are bare tokens
    fetching: bool
    # Resolved once the connection's last slow-path Produce reached the batcher.
    produce_gate: asyncio.Future[None] | None

    def authenticated(self, user: str) -> None:
        """SASL succeeded: the connection is ``user``'s, and no longer held to the limits of
        an unauthenticated one."""
        ...

    def close(self) -> None: ...

    def close_after_answers(self) -> None:
        """Close once every request so far is answered (a failed authentication)."""
        ...

    def hold_for_pressure(self) -> None:
        """Durable writes lag: read no more requests until they catch up."""
        ...


class RequestContext:
    """What a handler knows about the request besides its body."""

    __slots__ = ("api_key", "client_id", "conn", "correlation_id", "server", "tenant", "version")

    def __init__(self, conn: ConnectionState, server: ServerState, header: RequestHeader) -> None:
        self.conn = conn
        self.server = server
        self.tenant = conn.tenant
        self.api_key = header.api_key
        self.version = header.api_version
        self.correlation_id = header.correlation_id
        self.client_id = header.client_id

    @property
    def response(self) -> Any:
        """The response class of this request's API and version: ``ctx.response(...)``."""
        return response_class(self.api_key, self.version)


# A handler answers with a response object, encoded bytes, None (nothing to answer), or a
# future / coroutine of one of those.
Handler = Callable[[RequestContext, Any], Any]


__all__ = ["ConnectionState", "Handler", "RequestContext", "ServerState"]
