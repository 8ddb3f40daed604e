"""The MQTT listener and the broker-wide MQTT state: sessions, shared groups, retained store.

Subscriptions are routed as two destination types: ``subscription`` (one binding per client,
bound to each of its filters) and ``shared`` (one binding per ``$share/<group>/<filter>``,
delivering each message to one member); delivering to them, output batching and flow control
are ``flowmq_broker.mqtt.delivery``'s.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import sys
from typing import Any

import flowmq_metrics as metrics
from flowmq_broker.backpressure import Backpressure
from flowmq_broker.cluster import ClusterRouting
from flowmq_broker.connection_limits import ConnectionLimits
from flowmq_broker.listeners import listen
from flowmq_broker.mqtt.connection import DEFAULT_MAX_HELD_PACKETS, MqttConnection
from flowmq_broker.mqtt.delivery import (
    DEFAULT_MAX_INFLIGHT_BYTES,
    SHARED,
    SUBSCRIPTION,
    MqttDelivery,
)
from flowmq_broker.mqtt.offline import OfflineStore
from flowmq_broker.mqtt.retained import RetainedStore
from flowmq_broker.mqtt.session import (
    NEVER_EXPIRES,
    Session,
    SessionConnection,
    Subscription,
)
from flowmq_broker.mqtt.websocket import MqttWebSocketListener
from flowmq_broker.nodes import read_node_table
from flowmq_broker.routing import Binding, Router
from flowmq_broker.services import BrokerServices
from flowmq_broker.tls import ServerTls
from flowmq_core.acl import Authorizer
from flowmq_core.message import Message
from flowmq_core.message_codec import decode_message, encode_message
from flowmq_meta import keys
from flowmq_meta.api import MetaStore
from flowmq_meta.users import UserDirectory
from flowmq_objstore.api import ObjectStore
from flowmq_wire.mqtt import reason_codes as rc

log = logging.getLogger(__name__)

__all__ = ["MqttServer"]

# How long a reconnecting client waits for other nodes to hand over its session.
TAKEOVER_TIMEOUT_S = 1.0
# ``save_session(taking_from=ANY_OWNER)``: the holder handed the session over.
ANY_OWNER = "*"


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
        reuse_port: bool = False,
        allow_anonymous: bool = True,
        max_packet_size: int = 1024 * 1024,
        max_keep_alive: int = 65535,
        max_subscriptions: int = 0,
        max_sessions: int = 0,
        max_session_expiry: int = NEVER_EXPIRES,
        max_retained_messages: int = 0,
        max_retained_bytes: int = 0,
        offline: OfflineStore | None = None,
        cluster: ClusterRouting | None = None,
        authorizer: Authorizer | None = None,
        connection_limits: ConnectionLimits | None = None,
        max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
        max_held_packets: int = DEFAULT_MAX_HELD_PACKETS,
        pressure: Backpressure | None = None,
    ) -> None:
        self.router = router
        # Sessions, routes and retained messages on other nodes (None: a broker alone).
        self.cluster = cluster
        self.meta = meta
        self.users = users
        self.node_id = node_id
        self.host = host  # the address the listener binds
        self.reuse_port = reuse_port  # host mode: share the ports (flowmq_broker.listeners)
        self.allow_anonymous = allow_anonymous
        self.max_packet_size = max_packet_size
        self.max_keep_alive = max_keep_alive
        self.max_subscriptions = max_subscriptions or sys.maxsize  # per session; 0: no limit
        # Persistent sessions held here per namespace (their client ids), and how many a
        # CONNECT may bring a namespace to (mqtt_max_sessions; 0: no limit).
        self.persistent_sessions: dict[str, set[str]] = {}
        self.max_sessions = max_sessions or sys.maxsize
        # The longest session expiry granted, seconds (NEVER_EXPIRES: no cap): v5 requests
        # above it are lowered, and 3.1.1 persistent sessions (which ask for "never") get it.
        self.max_session_expiry = max_session_expiry
        # Packets a client may send while its CONNECT waits (login check, session takeover).
        self.max_held_packets = max_held_packets
        self.retained = RetainedStore(meta, objects, max_retained_messages, max_retained_bytes)
        # Durable store for offline persistent sessions (else their queue is in memory).
        self.offline = offline
        self.sessions: dict[tuple[str, str], Session] = {}
        # This process, as its session records name it (the cluster links' incarnation).
        self.process = cluster.links.incarnation if cluster is not None else None
        # Sessions of a node declared dead that a process of it still holds (adopt_sessions).
        self._kept_by: dict[str, int] = {}
        # The latest CONNECT of each client id being handled, one at a time (connect_turn).
        self._connect_turns: dict[tuple[str, str], asyncio.Future[None]] = {}
        self.shared_groups: dict[tuple[str, str], list[str]] = {}
        # The broker's ACLs (alone: everything allowed); a change drops the subscriptions
        # they no longer allow.
        self.authorizer = authorizer if authorizer is not None else Authorizer()
        self.authorizer.listeners.append(self._acls_changed)
        self.connections: set[SessionConnection] = set()
        # Shared with the broker's other client listeners (alone: no limits).
        self.connection_limits = connection_limits or ConnectionLimits()
        self._server: asyncio.base_events.Server | None = None
        # The TLS listener (start_tls), serving the same connections over TLS.
        self._tls_server: asyncio.base_events.Server | None = None
        self.tls: ServerTls | None = None
        # MQTT over WebSocket (start_websocket): ``GET /mqtt`` on its own HTTP sites.
        self._websocket: MqttWebSocketListener | None = None
        # Routing to subscribers, output batching and flow control (registers the
        # ``subscription`` and ``shared`` destination types with the router).
        self.delivery = MqttDelivery(
            router,
            self.sessions,
            self.shared_groups,
            offline=offline,
            max_inflight_bytes=max_inflight_bytes,
            pressure=pressure,
        )

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
            reuse_port=services.config.reuse_port,
            allow_anonymous=bool(services.config.allow_anonymous),
            max_keep_alive=services.config.mqtt_max_keep_alive,
            max_subscriptions=services.config.mqtt_max_subscriptions,
            max_sessions=services.config.mqtt_max_sessions,
            max_session_expiry=services.config.mqtt_max_session_expiry,
            max_retained_messages=services.config.mqtt_max_retained_messages,
            max_retained_bytes=services.config.mqtt_max_retained_bytes,
            offline=OfflineStore(services.queues.engine, services.queues.session_options),
            cluster=services.cluster,
            authorizer=services.authorizer,
            connection_limits=services.connection_limits,
            max_inflight_bytes=services.config.mqtt_max_inflight_bytes,
            max_held_packets=services.config.mqtt_max_held_packets,
            pressure=services.pressure,
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
            cluster.on_node_dead.append(self.adopt_sessions)
            cluster.on_fenced.append(self._fenced)
            cluster.on_links_blocked = self.delivery.on_links_blocked
            cluster.on_links_free = self.delivery.on_links_free
            cluster.on_forwarded_runs = self.delivery.deliver_forwarded_runs
        self._server, bound = await listen(
            lambda: MqttConnection(self), port, self.host, reuse_port=self.reuse_port
        )
        return bound

    async def start_tls(self, port: int, tls: ServerTls) -> int:
        """Serve MQTT over TLS on ``port`` too (after ``start``); returns the bound port."""
        self.tls = tls
        self._tls_server, bound = await listen(
            lambda: MqttConnection(self),
            port,
            self.host,
            ssl=tls.context,
            reuse_port=self.reuse_port,
        )
        return bound

    async def start_websocket(self, port: int, tls: ServerTls | None = None) -> int:
        """Serve MQTT over WebSocket (``/mqtt``, subprotocol ``mqtt``) on ``port`` too, over
        TLS with ``tls`` (after ``start``; ``start_tls`` first for WSS); the bound port."""
        if self._websocket is None:
            self._websocket = MqttWebSocketListener(self, reuse_port=self.reuse_port)
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

    def unbind(self, session: Session, sub: Subscription, handed_to: str | None = None) -> None:
        """Route ``sub`` here no more; ``handed_to``: the node that takes the session over
        (its route is kept for the others until they route the filter to that node)."""
        ns, name = session.namespace, sub.subscribed_filter
        if self.cluster is not None:
            if handed_to is None:
                self.cluster.local_removed(ns, name)
            else:
                self.cluster.hand_over(ns, name, handed_to)
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
        self,
        session: Session,
        *,
        forget: bool = True,
        redistribute: bool = True,
        handed_to: str | None = None,
    ) -> None:
        """End ``session`` here; ``forget`` also deletes its stored record (not when another
        node took it over: the record is that node's now); ``redistribute``: its unsettled
        shared-group messages go to other members (not when its state moved elsewhere);
        ``handed_to``: the node that takes it over (``unbind``)."""
        session.connection = None
        self.delivery.relieve(session)
        for sub in list(session.subscriptions.values()):
            self.unbind(session, sub, handed_to)
        session.subscriptions.clear()
        session.subscriptions_changed()
        if redistribute:
            self.delivery.redistribute(session, self.cluster)
        if self.sessions.get((session.namespace, session.client_id)) is session:
            del self.sessions[(session.namespace, session.client_id)]
            self.persistent_sessions.get(session.namespace, set()).discard(session.client_id)
        if session.expiry_handle is not None:
            session.expiry_handle.cancel()
        self.update_subscription_gauge()
        if forget:
            asyncio.get_running_loop().create_task(self.forget_session(session))
            if self.offline is not None:
                self.offline.forget(session)

    async def restore_sessions(
        self, dead: str | None = None, dead_process: str | None = None
    ) -> int:
        """Bring back persistent sessions, offline, subscriptions bound: at start, this
        node's and those of nodes no longer running; when a survivor adopts a dead node's
        sessions, those of ``dead`` (``dead_process``: the process of it that died, if known).

        A session is taken from another node only through its record (``save_session``); one
        whose record another node took meanwhile is let go again.  A restarted node marks its
        records as its new process's at start, so that a survivor that took it for dead a
        moment ago adopts none of them — two nodes must not hold one session, or what one
        stores may not reach the client connected to the other.  Their expiry restarts from now: the time the broker was down is not counted,
        as with Mosquitto's persistence.
        """
        if dead is None:
            running = {
                node["node_id"]
                for node in await read_node_table(self.meta)
                if node["status"] == "up" and node["node_id"] != self.node_id
            }
        begin, end = keys.SESSIONS.range()
        me, process = self.node_id, self.process

        def read(tr: Any) -> list[tuple[bytes, bytes]]:
            rows = tr.get_range(begin, end)
            if dead is None and process is not None:  # ours: this process's from now on
                for key, raw in rows:
                    record = json.loads(raw)
                    if record.get("node", me) == me and record.get("process") != process:
                        tr.set(key, json.dumps({**record, "process": process}).encode())
            return rows

        rows = await self.meta.transact(read)
        restored = 0
        adopted: list[tuple[Session, str]] = []
        reclaimed: list[tuple[Session, str]] = []
        not_adopted = 0
        for key, raw in rows:
            namespace, _ = keys.SESSIONS.unpack(key)
            record = json.loads(raw)
            # Records without an owner predate clusters: the single broker's.
            owner = record.get("node", me)
            if owner != dead if dead is not None else owner in running:
                continue
            here = self.sessions.get((namespace, record["client_id"]))
            if here is not None:
                if dead is not None and here.persistent():
                    # Still held here, its record the dead node's: that node claimed it to
                    # take it over and died before it asked (``fetch_session``).
                    reclaimed.append((here, owner))
                continue
            session = Session.from_record(record, namespace)
            self.install_session(session)  # held (and routed) here before the record says so
            if owner != me:
                session.adopted = True
                adopted.append((session, owner))
            restored += 1
        # Routed here before the records say so: a node that still holds one of them (it was
        # declared dead while paused) lets it go when it finds the record ours, and keeps its
        # route until every node has read ours (``hand_over``); written before ours, its
        # route went and ours was not out (the meta store slow under load), and a publisher
        # window matched no route and was acknowledged without being stored.
        routed = self.cluster.routes_published() if adopted and self.cluster is not None else None
        for i, (session, owner) in enumerate(adopted):  # ours now, unless taken meanwhile
            try:
                if routed is not None:
                    await routed
                    routed = None
                holder = await self._store_record(
                    session, taking_from=owner, taking_process=dead_process
                )
            except BaseException:  # not known to be ours: their owners' kicks end them
                for unstored, _ in adopted[i:]:
                    unstored.adopted = False
                raise
            if holder is not None:
                log.info(
                    "mqtt %s: not adopted: its node restarted, or another took it",
                    session.client_id,
                )
                if dead is not None and holder == dead:  # another process of it holds it
                    self._kept_by[dead] = self._kept_by.get(dead, 0) + 1
                if self.sessions.get((session.namespace, session.client_id)) is session:
                    self.discard_session(session, forget=False, redistribute=False)
                restored -= 1
                not_adopted += 1
        for session, owner in reclaimed:  # the records say so again (else left as they are)
            await self._store_record(session, taking_from=owner, taking_process=dead_process)
        if adopted:
            log.info(
                "mqtt: %d of %d persistent sessions of %s adopted",
                len(adopted) - not_adopted,
                len(adopted),
                dead if dead is not None else "nodes no longer running",
            )
        self.update_subscription_gauge()
        return restored

    async def adopt_sessions(self, dead: str, dead_process: str | None) -> bool:
        """Adopt the persistent sessions of ``dead`` (``restore_sessions``); False if a
        process of it other than ``dead_process`` still holds one (its record says so): the
        node is not gone — a restart, or a pause our view of its process is older than — and
        its routes must stay (refusing), or what is published for that session meanwhile
        would match no route and be acknowledged without being stored."""
        self._kept_by.pop(dead, None)
        await self.restore_sessions(dead, dead_process)
        return not self._kept_by.pop(dead, 0)

    def install_session(self, session: Session) -> None:
        """Make an offline session (restored or taken over) live here: bound, expiring."""
        for sub in session.subscriptions.values():
            self.bind(session, sub)
        self.revoke_denied(session)  # the rules may have changed while no broker held it
        self.sessions[(session.namespace, session.client_id)] = session
        # Stored before the cap was set or lowered (3.1.1 sessions asked for "never"): capped.
        session.expiry_interval = min(session.expiry_interval, self.max_session_expiry)
        self.count_persistence(session)
        if session.expiry_interval != NEVER_EXPIRES:
            session.expiry_handle = asyncio.get_running_loop().call_later(
                session.expiry_interval, self.expire, session
            )

    def count_persistence(self, session: Session) -> None:
        """``session``, just put in ``sessions`` or given a new expiry, counts towards its
        namespace's ``mqtt_max_sessions`` if it is persistent (``discard_session`` uncounts)."""
        ids = self.persistent_sessions.setdefault(session.namespace, set())
        if session.persistent():
            ids.add(session.client_id)
        else:
            ids.discard(session.client_id)

    def sessions_full(self, namespace: str) -> bool:
        """Whether ``namespace`` has ``mqtt_max_sessions`` persistent sessions here."""
        return len(self.persistent_sessions.get(namespace, ())) >= self.max_sessions

    # --- sessions across nodes -----------------------------------------------------------
    def connecting(self, key: tuple[str, str]) -> bool:
        """Whether a CONNECT of client id ``key`` is being handled (``connect_turn``)."""
        return key in self._connect_turns

    async def connect_turn(self, key: tuple[str, str]) -> asyncio.Future[None]:
        """Wait until the CONNECTs of client id ``key`` that came before are handled; the
        turn to hand back to ``end_connect_turn`` when this one is (in a ``finally``)."""
        previous = self._connect_turns.get(key)
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._connect_turns[key] = turn
        if previous is not None:
            try:
                await asyncio.shield(previous)
            except BaseException:
                self.end_connect_turn(key, turn)
                raise
        return turn

    def end_connect_turn(self, key: tuple[str, str], turn: asyncio.Future[None]) -> None:
        turn.set_result(None)
        if self._connect_turns.get(key) is turn:
            del self._connect_turns[key]

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
            # …and its record names this node before the holder is asked to let go: if this
            # node dies (or is paused past the failure detector) in between, the survivor
            # that adopts its sessions adopts this one.  Still naming the holder, which had
            # let go, the record left the session on no node once this node's routes were
            # cleared: what was published meanwhile matched no route and was acknowledged
            # without being stored (the pause test lost 174 messages so under load).
            await self.save_session(placeholder, taking_from=ANY_OWNER)
        replies = []
        if cluster is not None and cluster.has_peers:
            replies = await cluster.request_all(
                ["mqtt.takeover", namespace, client_id, True, False, self.node_id],
                TAKEOVER_TIMEOUT_S,
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
            await self.save_session(session, taking_from=ANY_OWNER)
        return session

    async def owns_session(self, namespace: str, client_id: str) -> bool:
        """Whether the stored record of ``client_id``'s session names this node (or there is
        none): a session held here may have been adopted by another node while this one was
        declared dead (paused, cut off), and is then that node's, not to be resumed here."""
        return await self.session_holder(namespace, client_id) in (None, self.node_id)

    async def session_holder(self, namespace: str, client_id: str) -> str | None:
        """The node the stored record of ``client_id``'s session names (None: no record)."""
        key = keys.SESSIONS.pack(namespace, client_id)
        raw = await self.meta.transact(lambda tr: tr.get(key))
        return None if raw is None else str(json.loads(raw).get("node", self.node_id))

    def kick(self, namespace: str, client_id: str, *, clean: bool) -> None:
        """Tell every other node to end its connection and session of ``client_id``
        (``clean``: the client started clean, so what was stored for it goes too)."""
        cluster = self.cluster
        if cluster is not None and cluster.has_peers:
            cluster.broadcast(["mqtt.takeover", 0, namespace, client_id, False, clean])

    def _on_takeover(self, args: list[Any]) -> Any:
        """Another node takes ``client_id``'s session: end it here (a kick), or hand it
        over (``want_state``: [namespace, client id, True, clean, the taking node])."""
        namespace, client_id, want_state, *rest = args
        clean = bool(rest and rest[0])
        taker = rest[1] if want_state and len(rest) > 1 else None
        if (
            taker is not None
            and self.cluster is not None
            and (namespace, client_id) in self.sessions
        ):
            return self._hand_over(namespace, client_id, taker)
        return self._let_go(namespace, client_id, want_state, clean)

    async def _hand_over(self, namespace: str, client_id: str, taker: str) -> Any:
        """``_let_go`` to ``taker``, once the routes it published for the session (before it
        asked) are read here: a message published here meanwhile reaches it (or is refused)."""
        assert self.cluster is not None
        await self.cluster.routes_read(taker)
        outcome = self._let_go(namespace, client_id, True, False, taker)
        return await outcome if inspect.isawaitable(outcome) else outcome

    def _let_go(
        self,
        namespace: str,
        client_id: str,
        want_state: bool,
        clean: bool,
        taker: str | None = None,
    ) -> Any:
        session = self.sessions.get((namespace, client_id))
        if session is None:
            return None
        if not want_state and not clean and session.adopted and session.connection is None:
            # A kick from a node that resumed the session on its record as it was before this
            # node adopted it (a paused node's, read just before the adoption wrote it): that
            # node finds the record ours when it stores its own and lets go.  Ended here too,
            # it was on no node, and what was published meanwhile matched no route and was
            # acknowledged without being stored.
            log.info("mqtt %s: adopted here, kept (a stale takeover)", client_id)
            return None
        if session.connection is not None:
            session.connection.take_over()
        state = session.export_state() if want_state and session.persistent() else None
        self.discard_session(session, forget=clean, redistribute=state is None, handed_to=taker)
        offline = self.offline
        acked = state is not None and offline is not None and offline.has_acked(session)
        if not session.pending_stores and not acked:
            return state

        async def when_stored() -> dict[str, Any] | None:
            # The new node reads the offline store next: let it find everything, and
            # nothing the client acknowledged here (it would get those again).
            loop = asyncio.get_running_loop()
            deadline = loop.time() + TAKEOVER_TIMEOUT_S  # the taker waits no longer
            if session.pending_stores:
                await asyncio.wait(list(session.pending_stores), timeout=TAKEOVER_TIMEOUT_S)
            if acked and offline is not None:
                try:
                    left = max(0.0, deadline - loop.time())
                    await asyncio.wait_for(offline.purge_acked(session), left)
                except Exception as exc:  # sent again there: twice, not lost
                    log.info("mqtt %s: acknowledged stored messages kept: %s", client_id, exc)
            return state

        return when_stored()

    async def _fenced(self) -> None:
        """The cluster declared this node dead (it was paused or cut off) and another node
        adopted its sessions: end them here, so that their clients reconnect and take them
        over from there (the records are that node's now).  Kept: the persistent sessions
        whose record names this node again (taken back since it resumed) and those being
        taken over right now (a CONNECT's turn) — ending them would leave them on no node, and a message
        published meanwhile would match no route and be acknowledged without being stored."""
        begin, end = keys.SESSIONS.range()
        try:
            rows = await self.meta.transact(lambda tr: tr.get_range(begin, end))
        except Exception as exc:  # none is known to be ours: all end (their clients return)
            log.warning("mqtt: could not read the session records: %s", exc)
            rows = []
        holders: dict[tuple[str, str], str] = {}
        for key, raw in rows:
            record = json.loads(raw)
            holders[(keys.SESSIONS.unpack(key)[0], record["client_id"])] = record.get(
                "node", self.node_id
            )
        ended = 0
        for key, session in list(self.sessions.items()):
            holder = holders.get(key)
            if key in self._connect_turns or (session.persistent() and holder == self.node_id):
                continue
            if session.connection is not None:
                session.connection.take_over()
            # The route stays until every node routes the session to its holder (hand_over).
            handed_to = holder if session.persistent() else None
            self.discard_session(session, forget=False, redistribute=False, handed_to=handed_to)
            ended += 1
        log.info("mqtt: %d sessions ended here, %d kept", ended, len(self.sessions))

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

    async def save_session(
        self,
        session: Session,
        *,
        taking_from: str | None = None,
        taking_process: str | None = None,
    ) -> bool:
        """Store ``session``'s record as this node's (and this process's).  Only over a
        record of this node (or none): another node's record means that node holds the
        session now (it adopted it while this one was declared dead), and it is left alone
        (False).  Taking a session over, ``taking_from`` names the owner the record must still
        have (``ANY_OWNER``: a takeover the holder agreed to) and ``taking_process``, if
        known, the process of it that died (a record its restarted process marked stays)."""
        found = await self._store_record(
            session, taking_from=taking_from, taking_process=taking_process
        )
        return found is None

    async def _store_record(
        self,
        session: Session,
        *,
        taking_from: str | None = None,
        taking_process: str | None = None,
    ) -> str | None:
        """``save_session``'s write: None if stored, else the node the record names (it
        holds the session), read in the same transaction."""
        key = keys.SESSIONS.pack(session.namespace, session.client_id)
        me = self.node_id
        value = json.dumps({**session.to_record(), "node": me, "process": self.process}).encode()

        def store(tr: Any) -> str | None:
            raw = tr.get(key)
            if raw is not None and taking_from != ANY_OWNER:
                record = json.loads(raw)
                owner = record.get("node", me)
                # a record of the process that died (not of its restart), when we know it
                of_dead = taking_process is None or record.get("process") in (None, taking_process)
                if owner != me and (owner != taking_from or not of_dead):
                    return str(owner)
            tr.set(key, value)
            return None

        return await self.meta.transact(store)

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
