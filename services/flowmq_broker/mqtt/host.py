"""What one MQTT connection needs from the broker-wide MQTT state, as a typed interface.

The adapter's modules depend one way: the wire codec (``flowmq_wire.mqtt``), then the state
(``metrics``, ``session``, ``offline``, ``retained``), then delivery and flow control
(``delivery``), then this interface, then the connection
(``connection``), then the server (``server``), which owns the state, implements
:class:`ConnectionHost` and is the only module that creates connections.  A lower module never
imports a higher one: a connection reaches the server only through this interface.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from flowmq_broker.cluster import ClusterRouting
from flowmq_broker.connection_limits import ConnectionLimits
from flowmq_broker.mqtt.delivery import MqttDelivery
from flowmq_broker.mqtt.offline import OfflineStore
from flowmq_broker.mqtt.retained import RetainedStore
from flowmq_broker.mqtt.session import Session, SessionConnection, Subscription
from flowmq_broker.routing import Router
from flowmq_broker.tls import ServerTls
from flowmq_core.acl import Authorizer
from flowmq_meta.users import UserDirectory


class ConnectionHost(Protocol):
    """The server side of a connection (``MqttServer``): settings, shared collaborators, the
    session registry, and the delivery (output batching, flow control) of all connections."""

    # --- settings and collaborators
    node_id: str  # this broker, as session records name their holder
    max_packet_size: int
    max_keep_alive: int
    max_subscriptions: int  # per session (mqtt_max_subscriptions)
    max_session_expiry: int  # seconds (mqtt_max_session_expiry; NEVER_EXPIRES: no cap)
    allow_anonymous: bool
    users: UserDirectory
    authorizer: Authorizer  # the broker's ACLs (flowmq_core.acl)
    router: Router
    retained: RetainedStore
    offline: OfflineStore | None  # durable store of offline persistent sessions, if any
    cluster: ClusterRouting | None  # None: a broker alone
    tls: ServerTls | None  # the TLS listener's settings, once it serves
    connection_limits: ConnectionLimits  # connections per listener and per client address

    # --- sessions
    sessions: dict[tuple[str, str], Session]

    def bind(self, session: Session, sub: Subscription) -> None: ...

    def unbind(self, session: Session, sub: Subscription) -> None: ...

    def update_subscription_gauge(self) -> None: ...

    def revoke_denied(self, session: Session) -> int:
        """Drop the subscriptions of ``session`` its user may no longer have; how many."""
        ...

    def discard_session(
        self,
        session: Session,
        *,
        forget: bool = True,
        redistribute: bool = True,
        handed_to: str | None = None,
    ) -> None: ...

    async def fetch_session(self, namespace: str, client_id: str) -> Session | None: ...

    def connecting(self, key: tuple[str, str]) -> bool: ...

    async def connect_turn(self, key: tuple[str, str]) -> asyncio.Future[None]: ...

    def end_connect_turn(self, key: tuple[str, str], turn: asyncio.Future[None]) -> None: ...

    def kick(self, namespace: str, client_id: str, *, clean: bool) -> None: ...

    async def save_session(self, session: Session, *, taking_from: str | None = None) -> bool:
        """Store the record as this node's, unless another node's record says it holds it."""
        ...

    async def session_holder(self, namespace: str, client_id: str) -> str | None:
        """The node the stored record names (None: there is none)."""
        ...

    def expire(self, session: Session) -> None: ...

    def count_persistence(self, session: Session) -> None:
        """``session`` was put in ``sessions`` or given a new expiry (mqtt_max_sessions)."""

    def sessions_full(self, namespace: str) -> bool:
        """Whether a new persistent session in ``namespace`` is past mqtt_max_sessions."""
        ...

    # --- output, delivery and flow control (shared by all connections)
    connections: set[SessionConnection]
    delivery: MqttDelivery
    max_held_packets: int  # packets a client may send while its CONNECT waits


__all__ = ["ConnectionHost"]
