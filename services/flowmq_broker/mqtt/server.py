"""The MQTT listener and the broker-wide MQTT state: sessions, shared groups, retained store.

It registers two destination types with the router: ``subscription`` (one binding per client,
bound to each of its filters) and ``shared`` (one binding per ``$share/<group>/<filter>``,
delivering each message to one member).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from typing import Any

import flowmq_metrics as metrics
from flowmq_broker.cluster import ClusterRouting
from flowmq_broker.listeners import listen
from flowmq_broker.mqtt.connection import MqttConnection
from flowmq_broker.mqtt.metrics import mqtt_metrics
from flowmq_broker.mqtt.offline import OfflineStore
from flowmq_broker.mqtt.retained import RetainedStore
from flowmq_broker.mqtt.session import (
    NEVER_EXPIRES,
    Session,
    SessionConnection,
    Subscription,
    session_enqueue,
)
from flowmq_broker.mqtt.websocket import MqttWebSocketListener
from flowmq_broker.nodes import read_node_table
from flowmq_broker.routing import Binding, DestinationType, Router
from flowmq_broker.services import BrokerServices
from flowmq_broker.tls import ServerTls
from flowmq_cluster.link import Link
from flowmq_core.acl import Authorizer
from flowmq_core.message import Message
from flowmq_core.message_codec import decode_message, encode_message
from flowmq_core.topics import matches
from flowmq_meta import keys
from flowmq_meta.api import MetaStore
from flowmq_meta.users import UserDirectory
from flowmq_objstore.api import ObjectStore
from flowmq_wire.mqtt import reason_codes as rc

log = logging.getLogger(__name__)

__all__ = ["MqttServer"]

SUBSCRIPTION = "subscription"
SHARED = "shared"
# A session with more QoS 1/2 messages waiting than this pauses reading from publishers until
# it is below RESUME_BELOW: bounded memory without dropping acknowledged messages.
PAUSE_ABOVE = 1000
RESUME_BELOW = 500
# How long a reconnecting client waits for other nodes to hand over its session.
TAKEOVER_TIMEOUT_S = 1.0


class MqttServer:
    def __init__(
        self,
        router: Router,
        meta: MetaStore,
        objects: ObjectStore,
        users: UserDirectory,
        *,
        node_id: str,
        host: str = "127.0.0.1",
        allow_anonymous: bool = True,
        max_packet_size: int = 1024 * 1024,
        max_keep_alive: int = 65535,
        offline: OfflineStore | None = None,
        cluster: ClusterRouting | None = None,
        authorizer: Authorizer | None = None,
    ) -> None:
        self.router = router
        # Sessions, routes and retained messages on other nodes (None: a broker alone).
        self.cluster = cluster
        self.meta = meta
        self.users = users
        self.node_id = node_id
        self.host = host  # the address the listener binds
        self.allow_anonymous = allow_anonymous
        self.max_packet_size = max_packet_size
        self.max_keep_alive = max_keep_alive
        self.retained = RetainedStore(meta, objects)
        # Durable store for offline persistent sessions (else their queue is in memory).
        self.offline = offline
        self.sessions: dict[tuple[str, str], Session] = {}
        self.shared_groups: dict[tuple[str, str], list[str]] = {}
        self._shared_turn = itertools.count()
        # The broker's ACLs (alone: everything allowed); a change drops the subscriptions
        # they no longer allow.
        self.authorizer = authorizer if authorizer is not None else Authorizer()
        self.authorizer.listeners.append(self._acls_changed)
        self.connections: set[SessionConnection] = set()
        self._server: asyncio.base_events.Server | None = None
        # The TLS listener (start_tls), serving the same connections over TLS.
        self._tls_server: asyncio.base_events.Server | None = None
        self.tls: ServerTls | None = None
        # MQTT over WebSocket (start_websocket): ``GET /mqtt`` on its own HTTP sites.
        self._websocket: MqttWebSocketListener | None = None
        self.dirty: list[SessionConnection] = []
        self._flush_scheduled = False
        self.current_publisher: SessionConnection | None = None
        self.congested: set[Session] = set()
        self.paused: set[SessionConnection] = set()
        # Cross-node flow control: publishers paused while a link to a peer is blocked, and
        # inbound links paused while a subscriber they feed cannot take more.
        self.link_paused: set[SessionConnection] = set()
        self.holding: dict[Link, set[SessionConnection]] = {}
        self._encode_cache_key: Any = None
        self._encode_cache: dict[Any, bytes] = {}
        router.register_type(_SubscriptionType(self))
        self._shared = _SharedType(self)
        router.register_type(self._shared)

    @classmethod
    def for_broker(cls, services: BrokerServices) -> MqttServer:
        """The adapter factory the broker process calls (see ``PROTOCOL_ADAPTERS``)."""
        return cls(
            services.router,
            services.meta,
            services.objects,
            services.users,
            node_id=services.node_id,
            host=services.config.bind,
            allow_anonymous=bool(services.config.allow_anonymous),
            max_keep_alive=services.config.mqtt_max_keep_alive,
            offline=OfflineStore(services.queues.engine, services.queues.session_options),
            cluster=services.cluster,
            authorizer=services.authorizer,
        )

    # --- life cycle ---------------------------------------------------------------------
    async def start(self, port: int) -> int:
        await self.retained.load()
        await self.restore_sessions()
        cluster = self.cluster
        if cluster is not None:
            cluster.requests["mqtt.takeover"] = self._on_takeover
            cluster.handlers["mqtt.retain"] = self._on_retained
            self.retained.on_change = self._retained_changed
            cluster.on_node_dead.append(self.restore_sessions)
            cluster.on_fenced.append(self._fenced)
            cluster.on_links_blocked = self._links_blocked
            cluster.on_links_free = self._links_free
        self._server, bound = await listen(lambda: MqttConnection(self), port, self.host)
        return bound

    async def start_tls(self, port: int, tls: ServerTls) -> int:
        """Serve MQTT over TLS on ``port`` too (after ``start``); returns the bound port."""
        self.tls = tls
        self._tls_server, bound = await listen(
            lambda: MqttConnection(self), port, self.host, ssl=tls.context
        )
        return bound

    async def start_websocket(self, port: int, tls: ServerTls | None = None) -> int:
        """Serve MQTT over WebSocket (``/mqtt``, subprotocol ``mqtt``) on ``port`` too, over
        TLS with ``tls`` (after ``start``; ``start_tls`` first for WSS); the bound port."""
        if self._websocket is None:
            self._websocket = MqttWebSocketListener(self)
        return await self._websocket.start(self.host, port, tls.context if tls else None)

    async def stop(self) -> None:
        if self._acls_changed in self.authorizer.listeners:
            self.authorizer.listeners.remove(self._acls_changed)
        servers = [s for s in (self._server, self._tls_server) if s is not None]
        for server in servers:
            server.close()
        for connection in list(self.connections):
            connection.shutdown()
        for server in servers:
            await server.wait_closed()
        if self._websocket is not None:
            await self._websocket.stop()

    # --- sessions ---------------------------------------------------------------------------
    def subscription_count(self) -> int:
        return sum(len(s.subscriptions) for s in self.sessions.values())

    def update_subscription_gauge(self) -> None:
        metrics.broker_subscriptions.set(self.subscription_count())

    def subscriptions_view(self) -> list[dict[str, Any]]:
        return [
            {
                "namespace": session.namespace,
                "topic_filter": sub.topic_filter,
                "client_id": session.client_id,
                "protocol": "mqtt",
                "node_id": self.node_id,
                "qos": sub.options.qos,
                "shared_group": sub.shared_group,
            }
            for session in self.sessions.values()
            for sub in session.subscriptions.values()
        ]

    def bind(self, session: Session, sub: Subscription) -> None:
        """Route ``sub`` to ``session``: one binding per client, or one per shared group
        with the session among its members; and announce the filter to the cluster."""
        ns, name = session.namespace, sub.subscribed_filter
        if sub.shared_group is None:
            binding = Binding(SUBSCRIPTION, ns, session.client_id)
        else:
            binding = Binding(SHARED, ns, name)
            members = self.shared_groups.setdefault((ns, name), [])
            if session.client_id not in members:
                members.append(session.client_id)
        self.router.bind(binding, sub.topic_filter)
        if self.cluster is not None:
            self.cluster.local_added(ns, name)

    def unbind(self, session: Session, sub: Subscription) -> None:
        ns, name = session.namespace, sub.subscribed_filter
        if self.cluster is not None:
            self.cluster.local_removed(ns, name)
        if sub.shared_group is None:
            self.router.unbind(Binding(SUBSCRIPTION, ns, session.client_id), sub.topic_filter)
            return
        members = self.shared_groups.get((ns, name), [])
        if session.client_id in members:
            members.remove(session.client_id)
        if not members:
            self.shared_groups.pop((ns, name), None)
            self.router.unbind(Binding(SHARED, ns, name), sub.topic_filter)

    def revoke_denied(self, session: Session) -> int:
        """Unbind the subscriptions of ``session`` its user may no longer have (the client is
        not told: MQTT has no server-side unsubscribe; Mosquitto likewise stops delivering)."""
        access = self.authorizer.access(session.namespace, session.username)
        denied = [
            (name, sub)
            for name, sub in session.subscriptions.items()
            if not access.may_subscribe(sub.topic_filter)
        ]
        for name, sub in denied:
            self.unbind(session, sub)
            del session.subscriptions[name]
        if denied:
            session.subscriptions_changed()
            log.info(
                "mqtt %s: ACLs no longer allow %s; unsubscribed",
                session.client_id,
                ", ".join(repr(name) for name, _ in denied),
            )
            if session.persistent():
                asyncio.get_running_loop().create_task(self._save_quietly(session))
        return len(denied)

    async def _save_quietly(self, session: Session) -> None:
        try:
            await self.save_session(session)
        except Exception:
            log.exception("could not save session %s", session.client_id)

    def _acls_changed(self) -> None:
        revoked = sum(self.revoke_denied(s) for s in list(self.sessions.values()))
        if revoked:
            self.update_subscription_gauge()

    def discard_session(
        self, session: Session, *, forget: bool = True, redistribute: bool = True
    ) -> None:
        """End ``session`` here; ``forget`` also deletes its stored record (not when another
        node took it over: the record is that node's now); ``redistribute``: its unsettled
        shared-group messages go to other members (not when its state moved elsewhere)."""
        session.connection = None
        self.relieve(session)
        for sub in list(session.subscriptions.values()):
            self.unbind(session, sub)
        session.subscriptions.clear()
        session.subscriptions_changed()
        if redistribute:
            self.redistribute(session)
        if self.sessions.get((session.namespace, session.client_id)) is session:
            del self.sessions[(session.namespace, session.client_id)]
        if session.expiry_handle is not None:
            session.expiry_handle.cancel()
        self.update_subscription_gauge()
        if forget:
            asyncio.get_running_loop().create_task(self.forget_session(session))
            if self.offline is not None:
                self.offline.forget(session)

    async def restore_sessions(self, dead: str | None = None) -> int:
        """Bring back persistent sessions, offline, subscriptions bound: at start, this
        node's and those of nodes no longer running; when a survivor adopts a dead node's
        sessions, those of ``dead``.

        Their expiry restarts from now: the time the broker was down is not counted, as with
        Mosquitto's persistence.
        """
        if dead is None:
            running = {
                node["node_id"]
                for node in await read_node_table(self.meta)
                if node["status"] == "up" and node["node_id"] != self.node_id
            }
        begin, end = keys.SESSIONS.range()
        rows = await self.meta.transact(lambda tr: tr.get_range(begin, end))
        restored = 0
        adopted: list[Session] = []
        for key, raw in rows:
            namespace, _ = keys.SESSIONS.unpack(key)
            record = json.loads(raw)
            # Records without an owner predate clusters: the single broker's.
            owner = record.get("node", self.node_id)
            if owner != dead if dead is not None else owner in running:
                continue
            if (namespace, record["client_id"]) in self.sessions:
                continue
            session = Session.from_record(record, namespace)
            self.install_session(session)
            if owner != self.node_id:
                adopted.append(session)
            restored += 1
        for session in adopted:  # the records are ours now
            await self.save_session(session)
        self.update_subscription_gauge()
        return restored

    def install_session(self, session: Session) -> None:
        """Make an offline session (restored or taken over) live here: bound, expiring."""
        for sub in session.subscriptions.values():
            self.bind(session, sub)
        self.revoke_denied(session)  # the rules may have changed while no broker held it
        self.sessions[(session.namespace, session.client_id)] = session
        if session.expiry_interval not in (0, NEVER_EXPIRES):
            session.expiry_handle = asyncio.get_running_loop().call_later(
                session.expiry_interval, self.expire, session
            )

    # --- sessions across nodes -----------------------------------------------------------
    async def fetch_session(self, namespace: str, client_id: str) -> Session | None:
        """A client reconnects here without a clean start, its session not here: take it over
        from the node that holds it, or from its stored record if that node is gone."""
        cluster = self.cluster
        key = keys.SESSIONS.pack(namespace, client_id)
        raw = await self.meta.transact(lambda tr: tr.get(key))
        placeholder = None
        if raw is not None and (namespace, client_id) not in self.sessions:
            # Routed here (offline, storing) before the node that holds it lets go, so that
            # no message for it finds no node in between.
            placeholder = Session.from_record(json.loads(raw), namespace)
            self.install_session(placeholder)
            routed = cluster.routes_published() if cluster is not None else None
            if routed is not None:
                await routed
        replies = []
        if cluster is not None and cluster.has_peers:
            replies = await cluster.request_all(
                ["mqtt.takeover", namespace, client_id, True], TAKEOVER_TIMEOUT_S
            )
        state = next((reply for reply in replies if reply), None)
        current = self.sessions.get((namespace, client_id))
        if current is not None and current is not placeholder:  # it came back here meanwhile
            return current
        if state is None:
            if placeholder is None:
                return None
            session = placeholder  # the node that held it is gone: its record is all
        else:
            if placeholder is not None:  # what it stored meanwhile is taken with the rest
                self.discard_session(placeholder, forget=False, redistribute=False)
            session = Session.from_state(state, namespace)
            self.install_session(session)
        if session.persistent():  # ours now, even if the client goes before CONNACK
            await self.save_session(session)
        return session

    def kick(self, namespace: str, client_id: str, *, clean: bool) -> None:
        """Tell every other node to end its connection and session of ``client_id``
        (``clean``: the client started clean, so what was stored for it goes too)."""
        cluster = self.cluster
        if cluster is not None and cluster.has_peers:
            cluster.broadcast(["mqtt.takeover", 0, namespace, client_id, False, clean])

    def _on_takeover(self, args: list[Any]) -> Any:
        namespace, client_id, want_state, *rest = args
        clean = bool(rest and rest[0])
        session = self.sessions.get((namespace, client_id))
        if session is None:
            return None
        if session.connection is not None:
            session.connection.take_over()
        state = session.export_state() if want_state and session.persistent() else None
        self.discard_session(session, forget=clean, redistribute=state is None)
        if not session.pending_stores:
            return state

        async def when_stored() -> dict[str, Any] | None:
            # The new node reads the offline store next: let it find everything.
            await asyncio.wait(list(session.pending_stores), timeout=TAKEOVER_TIMEOUT_S)
            return state

        return when_stored()

    def _fenced(self) -> None:
        """The cluster declared this node dead (it was paused or cut off) and another node
        adopted its sessions: end them here, so that their clients reconnect and take them
        over from there (the records are that node's now)."""
        for session in list(self.sessions.values()):
            if session.connection is not None:
                session.connection.take_over()
            self.discard_session(session, forget=False, redistribute=False)

    def _retained_changed(self, namespace: str, message: Message) -> None:
        cluster = self.cluster
        if cluster is not None and cluster.has_peers:
            cluster.broadcast(["mqtt.retain", namespace, encode_message(message)])

    def _on_retained(self, link: Any, frame: list[Any]) -> None:
        _, namespace, data = frame
        self.retained.remember(namespace, decode_message(data))

    def expire(self, session: Session) -> None:
        """The session expiry interval ran out while the client was away."""
        if session.online:
            return
        if session.will_handle is not None:  # the will delay outlasted the session: send now
            session.will_handle.cancel()
            session.pending_will()
        self.discard_session(session)

    async def save_session(self, session: Session) -> None:
        key = keys.SESSIONS.pack(session.namespace, session.client_id)
        value = json.dumps({**session.to_record(), "node": self.node_id}).encode()
        await self.meta.transact(lambda tr: tr.set(key, value))

    async def forget_session(self, session: Session) -> None:
        key = keys.SESSIONS.pack(session.namespace, session.client_id)

        def clear_if_ours(tr: Any) -> None:
            raw = tr.get(key)  # another node may own the client id's record by now
            if raw is not None and json.loads(raw).get("node", self.node_id) == self.node_id:
                tr.clear(key)

        try:
            await self.meta.transact(clear_if_ours)
        except Exception:
            log.exception("could not remove session %s from the meta store", session.client_id)

    # --- output and flow control -----------------------------------------------------------
    def mark_dirty(self, connection: SessionConnection) -> None:
        self.dirty.append(connection)
        if not self._flush_scheduled:  # writes made outside a read (timers, HTTP publish)
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush_dirty)

    def flush_dirty(self) -> None:
        self._flush_scheduled = False
        dirty, self.dirty = self.dirty, []
        for connection in dirty:
            connection.flush()

    def check_congestion(self, session: Session) -> None:
        """Pause the publisher whose message just queued up behind a slow subscriber (an
        online one: an offline session's queue is bounded instead, never holding others up)."""
        if len(session.queue) <= PAUSE_ABOVE or not session.online:
            return
        self.congested.add(session)
        publisher = self.current_publisher
        if publisher is not None and publisher not in self.paused and publisher.transport:
            publisher.transport.pause_reading()
            self.paused.add(publisher)

    def relieve(self, session: Session) -> None:
        """Called when a session's queue shrank or it went away (offline, discarded)."""
        if session in self.congested and (len(session.queue) < RESUME_BELOW or not session.online):
            self.congested.discard(session)
        if not self.congested and self.paused:
            paused, self.paused = self.paused, set()
            for publisher in paused:
                if publisher.transport is not None and publisher not in self.link_paused:
                    publisher.transport.resume_reading()

    def is_paused(self, publisher: SessionConnection) -> bool:
        return publisher in self.paused or publisher in self.link_paused

    def _links_blocked(self) -> None:
        """The publisher being read forwards into a link the peer is not draining: stop
        reading it until the link is clear (TCP pushes back to the client)."""
        publisher = self.current_publisher
        if publisher is not None and publisher not in self.link_paused and publisher.transport:
            publisher.transport.pause_reading()
            self.link_paused.add(publisher)

    def _links_free(self) -> None:
        paused, self.link_paused = self.link_paused, set()
        for publisher in paused:
            if publisher.transport is not None and publisher not in self.paused:
                publisher.transport.resume_reading()

    def forwarding_link(self) -> Link | None:
        """The inter-broker link the message being delivered came in on, if any."""
        cluster = self.cluster
        return cluster.receiving if cluster is not None else None

    def hold_link(self, link: Link, subscriber: SessionConnection) -> None:
        """``subscriber`` cannot take what ``link`` brings as fast: stop reading the link
        until it drains (the sending broker then slows its publishers down)."""
        holders = self.holding.get(link)
        if holders is None:
            holders = self.holding[link] = set()
            if link.transport is not None:
                link.transport.pause_reading()
        holders.add(subscriber)

    def release_links(self, subscriber: SessionConnection) -> None:
        """``subscriber`` drained (or went): resume the links only it was holding."""
        for link, holders in list(self.holding.items()):
            holders.discard(subscriber)
            if not holders:
                del self.holding[link]
                if link.transport is not None:
                    link.transport.resume_reading()

    # --- delivery ------------------------------------------------------------------------
    def deliver(
        self,
        session: Session,
        message: Message,
        subs: list[Subscription],
        shared: str | None = None,
    ) -> asyncio.Future[Any] | None:
        """Send or queue ``message`` for ``session`` (as a member of the ``shared`` group,
        if given); a future when it went to the offline store (done once durable: the
        publisher's acknowledgement waits for it)."""
        if message.properties.get("origin") == session.client_id:
            subs = [s for s in subs if not s.options.no_local]
            if not subs:
                return
        if len(subs) == 1:  # the common case, without the generator machinery
            options = subs[0].options
            qos = message.qos if message.qos < options.qos else options.qos
            retain = message.retain and options.retain_as_published
            identifiers = [subs[0].identifier] if subs[0].identifier else _NO_IDS
        else:
            qos = min(message.qos, max(s.options.qos for s in subs))
            retain = message.retain and any(s.options.retain_as_published for s in subs)
            identifiers = [s.identifier for s in subs if s.identifier]
        connection = session.connection
        if connection is not None:
            connection.send_message(message, qos, retain, identifiers, shared)
            if qos > 0 and self.offline is not None and session.persistent():
                # Durable before the publisher's acknowledgement, online or not (offline.py).
                return self.offline.keep(session, message, qos, retain, identifiers)
        elif qos > 0 and session.persistent():
            if self.offline is not None:
                return self.offline.store(session, message, qos, retain, identifiers)
            session_enqueue(session, message, qos, retain, identifiers, shared)
        return None

    def redistribute(self, session: Session) -> None:
        """``session`` ended with messages of shared groups unacknowledged: give each to
        another member (MQTT 5 §4.8.2: the Server SHOULD), here or on another node.  A QoS 2
        message the client already received (PUBREC) is its own."""
        orphans = [
            (out.message, out.properties["shared"])
            for out in session.inflight.values()
            if "shared" in out.properties and not out.released
        ]
        orphans += [(m, extra["shared"]) for m, _, _, extra in session.queue if "shared" in extra]
        cluster = self.cluster
        for message, group in orphans:
            if self.shared_groups.get((session.namespace, group)):
                self._shared.accept(Binding(SHARED, session.namespace, group), message)
            elif cluster is None or not cluster.forward_to_group(session.namespace, message, group):
                mqtt_metrics(session.namespace).dropped.inc()

    def encodings(self, message: Message) -> dict[Any, Any]:
        """Encodings of ``message`` made during its fan-out, shared by every subscriber of
        the same protocol level (DESIGN.md §11: encode a fanned-out message once)."""
        if self._encode_cache_key is not message:
            self._encode_cache_key = message
            self._encode_cache = {}
        return self._encode_cache

    # --- operations view (admin API: clients, kick) -----------------------------------------
    def clients(self) -> list[dict[str, Any]]:
        """Read only: this broker's MQTT connections, as ``GET /api/v1/clients`` shows them."""
        return [_client_view(conn, self.node_id) for conn in list(self.connections)]

    def disconnect_client(self, connection_id: str) -> bool:
        """End the connection ``connection_id`` (a view's ``id``): a v5 client gets
        DISCONNECT 0x98 (administrative action), a 3.1.1 client a closed socket."""
        for conn in list(self.connections):
            if isinstance(conn, MqttConnection) and _connection_id(conn) == connection_id:
                conn.disconnect(rc.ADMINISTRATIVE_ACTION, "disconnected by an administrator")
                return True
        return False


_NO_IDS: list[int] = []


class _SubscriptionType(DestinationType):
    name = SUBSCRIPTION
    durable = False

    def __init__(self, server: MqttServer) -> None:
        self.server = server

    def accept(self, binding: Binding, message: Message) -> asyncio.Future[Any] | None:
        session = self.server.sessions.get((binding.namespace, binding.name))
        if session is None:
            return None
        plain = session.plain_subscriptions()
        if len(plain) != 1:  # which of the client's filters matched decides QoS and ids
            topic = message.topic
            plain = [sub for sub in plain if matches(sub.topic_filter, topic)]
        if plain:  # one plain filter: the trie matched this client, so it matched that one
            return self.server.deliver(session, message, plain)
        return None


class _SharedType(DestinationType):
    name = SHARED
    durable = False
    one_member = True

    def __init__(self, server: MqttServer) -> None:
        self.server = server

    def accept(self, binding: Binding, message: Message) -> asyncio.Future[Any] | None:
        server = self.server
        members = server.shared_groups.get((binding.namespace, binding.name))
        if not members:
            return None
        # Round robin over online members; an offline persistent member only when no one is on.
        start = next(server._shared_turn)
        chosen = None
        for i in range(len(members)):
            session = server.sessions.get((binding.namespace, members[(start + i) % len(members)]))
            if session is not None and session.online:
                chosen = session
                break
            if chosen is None and session is not None:
                chosen = session
        if chosen is None:
            return None
        sub = chosen.subscriptions.get(binding.name)
        if sub is not None:
            return server.deliver(chosen, message, [sub], binding.name)
        return None


def _address(conn: MqttConnection) -> str:
    peer = conn.transport.get_extra_info("peername") if conn.transport else None
    return f"{peer[0]}:{peer[1]}" if peer else "?"


def _connection_id(conn: MqttConnection) -> str:
    return f"mqtt:{_address(conn)}"


def _client_view(conn: SessionConnection, node_id: str) -> dict[str, Any]:
    assert isinstance(conn, MqttConnection)
    session = conn.session
    return {
        "id": _connection_id(conn),
        "protocol": "mqtt",
        "protocol_version": "5.0" if conn.level == 5 else "3.1.1",
        "node_id": node_id,
        "address": _address(conn),
        "namespace": conn.namespace,
        "user": conn.username,
        "client_id": conn.client_id or None,
        "connected": session is not None,
        "session": None
        if session is None
        else {"expiry_interval": session.expiry_interval, "persistent": session.persistent()},
        "subscriptions": [] if session is None else sorted(session.subscriptions),
        "inflight": 0 if session is None else len(session.inflight),
        "queued": 0 if session is None else len(session.queue),
        "keep_alive": conn.keep_alive,
    }
