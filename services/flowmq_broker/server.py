"""One broker process: meta store, object store, routing, listeners, admin API."""

from __future__ import annotations

import asyncio
import importlib
import ipaddress
import json
import logging
import os
import secrets
import socket
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import log as web_log
from aiohttp import web

import flowmq_metrics as metrics
from flowmq_admin.app import create_app
from flowmq_broker.admin_token import load_or_create_token
from flowmq_broker.backpressure import MEMORY_CHECK_INTERVAL_S, Backpressure, MemoryBudget
from flowmq_broker.cluster import ClusterRouting
from flowmq_broker.connection_limits import ConnectionLimits
from flowmq_broker.group_admin import GroupAdmin
from flowmq_broker.listeners import bind_socket
from flowmq_broker.live import LiveViews
from flowmq_broker.nodes import DataDirLock, NodeRegistry
from flowmq_broker.operations import OperationsBackend
from flowmq_broker.queues import QueueService
from flowmq_broker.readiness import Readiness
from flowmq_broker.routing import CatalogSync, Router
from flowmq_broker.runtime import HEAP_TRIM_INTERVAL_S, trim_heap
from flowmq_broker.services import BrokerServices
from flowmq_broker.streams import StreamDestinationType
from flowmq_broker.tls import ServerTls, TlsError, server_tls
from flowmq_cluster import ClusterSecret, Gossip, GossipConfig, Member, Status
from flowmq_cluster.auth import check_bind
from flowmq_commit.batcher import STORE_FAILURES, GroupCommitBatcher
from flowmq_core.acl import Authorizer
from flowmq_core.config import BrokerConfig, ConfigError, is_loopback
from flowmq_core.errors import Overloaded, QuotaExceeded
from flowmq_core.message import Message
from flowmq_core.periodic import PeriodicTask
from flowmq_core.version import flowmq_version
from flowmq_jobs.stream_maintenance import INTERVAL_S as STREAM_MAINTENANCE_INTERVAL_S
from flowmq_jobs.stream_maintenance import StreamMaintenance
from flowmq_kas3.page_cache import PageCache
from flowmq_kas3.store import StreamStore
from flowmq_meta import acls, open_meta_store
from flowmq_meta.api import MetaError, MetaStore
from flowmq_meta.catalog import Catalog, Destination
from flowmq_meta.tokens import TokenDirectory
from flowmq_meta.users import UserDirectory
from flowmq_objstore import open_object_store
from flowmq_objstore.api import ObjectStore, ObjectStoreError

if TYPE_CHECKING:
    from flowmq_broker.kafka.server import KafkaServer
    from flowmq_broker.mqtt.server import MqttServer

log = logging.getLogger(__name__)

PROTOCOL_ADAPTERS = {
    # role: (module, factory taking the BrokerServices, config key of its port); imported only
    # when the role is on, so a Kafka-only broker never loads the MQTT or AMQP code.
    "mqtt": ("flowmq_broker.mqtt.server", "MqttServer.for_broker", "mqtt_port"),
    "kafka": ("flowmq_broker.kafka.server", "KafkaServer", "kafka_port"),
    "amqp": ("flowmq_broker.amqp.server", "AmqpServer", "amqp_port"),
}


PAGE_CACHE_BYTES = 64 * 1024 * 1024
METADATA_EVENT = "metadata.changed"
ROUTES_EVENT = "routes.changed"
# Test-only fault: the broker ignores every gossip event it receives, as if gossip lost them
# (tests/cluster: anti-entropy must still bring it up to date).
IGNORE_EVENTS_ENV = "FLOWMQ_TEST_IGNORE_GOSSIP_EVENTS"


def _advertised_host() -> str:
    """The address other brokers reach us at: this host's name resolved, else loopback."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _cluster_advertised_host(bind: str) -> str:
    """The address peers reach our gossip and links at: the bind address itself, unless it
    is the unspecified address (0.0.0.0, ::), where it is this host's name resolved."""
    if ipaddress.ip_address(bind).is_unspecified:
        return _advertised_host()
    return bind


def _anonymous_mode(allow_anonymous: bool | None, bind: str) -> str:
    """Whether anonymous clients may connect and why, for the start-up log
    (``allow_anonymous`` as configured: None when not set)."""
    if allow_anonymous is None:
        if is_loopback(bind):
            return "allowed (bind is loopback and allow_anonymous is not set)"
        return "refused (bind is not loopback and allow_anonymous is not set)"
    return f"{'allowed' if allow_anonymous else 'refused'} (allow_anonymous = {str(allow_anonymous).lower()})"


def _liveness(member: Member) -> dict[str, str]:
    """A gossip member's state as the cluster nodes API shows it (SWIM counts suspects live)."""
    status = member.status.value
    return {"status": "up" if status in ("alive", "suspect") else "down", "gossip": status}


class StartupError(Exception):
    """A problem that stops the broker from starting; its message is one clear line."""


def _cluster_secret(config: BrokerConfig) -> ClusterSecret | None:
    """The cluster secret, or None for an open plane, which may only bind loopback."""
    try:
        text = config.read_cluster_secret()
        secret = ClusterSecret(text) if text else None
        check_bind(config.cluster_bind, secret)
    except (ConfigError, ValueError) as exc:
        raise StartupError(str(exc)) from None
    return secret


def _gossip_tuning(cfg: BrokerConfig) -> GossipConfig:
    try:
        return GossipConfig(
            gossip_interval=cfg.gossip_interval,
            gossip_nodes=cfg.gossip_nodes,
            probe_interval=cfg.gossip_probe_interval,
            probe_timeout=cfg.gossip_probe_timeout,
            indirect_checks=cfg.gossip_indirect_checks,
            suspicion_mult=cfg.gossip_suspicion_mult,
            push_pull_interval=cfg.gossip_push_pull_interval,
        )
    except ValueError as exc:
        raise StartupError(f"gossip settings: {exc}") from None


def _server_tls(config: BrokerConfig) -> ServerTls | None:
    """The TLS listeners' settings, checked before anything is bound; None without TLS."""
    try:
        return server_tls(config)
    except TlsError as exc:
        raise StartupError(str(exc)) from None


def _check_data_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StartupError(f"cannot create data dir {path}: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise StartupError(f"data dir {path} is not writable")


class Broker(OperationsBackend):
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config.resolved()
        self._configured_anonymous = config.allow_anonymous  # None: follows ``bind``
        self.data_dir = Path(self.config.data_dir)
        self.meta: MetaStore | None = None
        self.objects: ObjectStore | None = None
        # Built in ``start`` with its cluster forwarder, once the node id is known.
        self.router: Router
        self.services: BrokerServices
        self.authorizer: Authorizer
        self.catalog: Catalog | None = None
        self.sync: CatalogSync | None = None
        self.nodes_registry: NodeRegistry | None = None
        self.data_dir_lock = DataDirLock(self.data_dir)
        self.ports: dict[str, int] = {}
        self.node_id = self.config.node_id
        self.admin_token = ""
        self.token_generated = False
        self._runner: web.AppRunner | None = None
        self.adapters: dict[str, Any] = {}
        self.gossip: Gossip | None = None
        self.batcher: GroupCommitBatcher | None = None
        # Publishers paused while the batcher's backlog is over its high-water mark.
        self.pressure = Backpressure()
        self.streams: StreamStore | None = None
        self.maintenance: PeriodicTask | None = None
        # memory_limit, when set: resident memory checked every second.
        self.memory_budget: MemoryBudget | None = None
        self.memory_watch: PeriodicTask | None = None
        # The C heaps' free pages given back to the OS now and then (runtime.trim_heap).
        self.heap_trim: PeriodicTask | None = None
        self.queues: QueueService | None = None
        self.cluster: ClusterRouting | None = None
        self.cluster_secret: ClusterSecret | None = None
        self.tls: ServerTls | None = None  # the TLS listeners' settings, if configured
        # The operations surface (admin API's health, counts, groups): built in ``start``.
        self.live: LiveViews | None = None
        self.group_admin: GroupAdmin | None = None
        self.readiness: Readiness | None = None
        self.stopping = False
        self._ignore_events = os.environ.get(IGNORE_EVENTS_ENV) == "1"

    @property
    def mqtt(self) -> MqttServer | None:
        return self.adapters.get("mqtt")

    @property
    def kafka(self) -> KafkaServer | None:
        return self.adapters.get("kafka")

    # --- AdminBackend ---------------------------------------------------------------
    def _destinations(self, bindings: Any) -> list[Destination]:
        """The catalog destinations among routed bindings (memory subscriptions have none)."""
        found = (self.router.destination(b) for b in bindings)
        return [dest for dest in found if dest is not None]

    def route(self, namespace: str, topic: str) -> list[Destination]:
        return self._destinations(self.router.match(namespace, topic))

    async def publish(self, namespace: str, message: Message) -> list[Destination]:
        return (await self.publish_batch(namespace, [message]))[0]

    async def publish_batch(
        self, namespace: str, messages: list[Message]
    ) -> list[list[Destination]]:
        """Route every message in order, then wait once for all of them to be durable: a
        batch shares flushes instead of waiting for one per message.  While durable writes
        lag (backpressure.py) nothing is taken: ``Overloaded`` (HTTP 503, Retry-After)."""
        if self.pressure.active:
            raise Overloaded("durable writes lag behind; retry later")
        routed = []
        pending: list[Any] = []
        for message in messages:
            if message.retain and self.mqtt is not None:
                try:
                    await self.mqtt.retained.set(namespace, message)
                except QuotaExceeded:
                    pass  # as an MQTT QoS 0 publish: delivered, not retained (counted, logged)
            bindings, durable = self.router.dispatch(namespace, message)
            routed.append(bindings)
            pending.extend(durable)
        if pending:
            await asyncio.gather(*pending)
        return [self._destinations(bindings) for bindings in routed]

    def subscriber_nodes(self, namespace: str, topic: str) -> list[str]:
        local = any(not self.router.is_durable(b) for b in self.router.match(namespace, topic))
        remote = self.cluster.nodes_matching(namespace, topic) if self.cluster else set()
        return sorted({self.node_id} | remote if local else remote)

    def subscriptions(self) -> list[dict[str, Any]]:
        return self.mqtt.subscriptions_view() if self.mqtt is not None else []

    async def nodes(self) -> list[dict[str, Any]]:
        """The node table, with liveness from gossip where gossip knows the node."""
        assert self.nodes_registry is not None
        nodes = await self.nodes_registry.list()
        if self.gossip is None:
            return nodes
        members = {m.node_id: m for m in self.gossip.all_members()}
        for node in nodes:
            member = members.pop(node["node_id"], None)
            if member is not None:
                node.update(_liveness(member), host=member.addr[0])
        for member in members.values():  # gossip knows it, the node table not (yet)
            nodes.append(
                {
                    "node_id": member.node_id,
                    **_liveness(member),
                    "host": member.addr[0],
                    "roles": member.meta.get("roles", []),
                    "self": False,
                }
            )
        return nodes

    async def _refresh_acls(self) -> None:
        """After a metadata change: reload the ACL rules if they moved, and re-resolve the
        users whose groups did."""
        assert self.meta is not None
        await acls.refresh(self.meta, self.authorizer)
        self.authorizer.groups_changed()

    async def metadata_changed(self) -> None:
        """A change was committed through this broker: apply it, then tell the cluster."""
        assert self.sync is not None
        await self.sync.refresh()
        self._announce(METADATA_EVENT, {"version": self.router.version})

    def _announce(self, kind: str, payload: dict[str, Any]) -> None:
        if self.gossip is not None:
            self.gossip.broadcast(kind, payload)
            metrics.gossip_events_originated_count.inc()

    def _gossip_event(self, kind: str, payload: dict[str, Any], hops: int, origin: str) -> None:
        if self._ignore_events:
            return
        metrics.gossip_event_propagation_hops_count.inc(hops)
        if kind == ROUTES_EVENT and self.cluster is not None:
            self.cluster.routes_announced(origin, payload["token"], payload["seq"])
        elif kind == METADATA_EVENT and payload.get("version", 0) > self.router.version:
            asyncio.get_running_loop().create_task(self._refresh_quietly())

    async def _refresh_quietly(self) -> None:
        try:
            assert self.sync is not None
            await self.sync.refresh()
        except Exception:  # anti-entropy will retry within a second
            log.exception("metadata refresh after a gossip event failed")

    # --- life cycle -------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        self.cluster_secret = _cluster_secret(cfg)  # before anything is bound or written
        self.tls = _server_tls(cfg)
        gossip_tuning = _gossip_tuning(cfg)  # a bad setting says so, not a port in use
        _check_data_dir(self.data_dir)
        self.data_dir_lock.acquire()
        try:
            self.meta = open_meta_store(cfg.meta)
            self.objects = open_object_store(cfg.objects, on_request=metrics.record_object_request)
        except (MetaError, ObjectStoreError) as exc:
            raise StartupError(str(exc)) from None
        self.catalog = Catalog(self.meta)
        try:
            await self.catalog.ensure_namespace()
        except MetaError as exc:
            raise StartupError(f"meta store {cfg.meta}: {exc}") from None
        http_sockets = self._bind_http()
        if not self.node_id:
            self.node_id = f"{socket.gethostname()}-{self.ports['http']}"
        self.data_dir_lock.write(self.node_id)
        self.cluster = ClusterRouting(
            self.node_id,
            self.meta,
            members=self._live_peers,
            on_routes_changed=self._announce_routes,
            bind=cfg.cluster_bind,
            secret=self.cluster_secret,
        )
        self.router = Router(forwarder=self.cluster)
        object_owner = self._node_key()
        self.batcher = GroupCommitBatcher(
            self.meta,
            self.objects,
            node_id=object_owner,
            high_water=cfg.pending_writes_high_water,
            high_water_chunks=cfg.pending_writes_high_water_chunks,
        )
        self.batcher.pressure_listeners.append(self.pressure.on_pressure)
        await self.batcher.start()
        self.streams = StreamStore(
            self.meta, self.objects, self.batcher, PageCache(PAGE_CACHE_BYTES)
        )
        self.router.register_type(StreamDestinationType(self.streams, self.router))
        self.queues = QueueService(
            self.router,
            self.catalog,
            self.meta,
            self.objects,
            self.batcher,
            session_max_bytes=cfg.mqtt_max_offline_bytes,
        )
        self.queues.start()
        self.live = LiveViews(self.streams, self.queues.engine)
        self.maintenance = PeriodicTask(
            "stream-maintenance",
            STREAM_MAINTENANCE_INTERVAL_S,
            StreamMaintenance(
                self.meta, self.objects, self.router.destinations, object_owner
            ).run_once,
            faults=STORE_FAILURES,  # an object store outage: one line, not a trace a run
        )
        self.users = UserDirectory(self.meta)
        self.tokens = TokenDirectory(self.meta)
        log.info(
            "client listeners and the HTTP API bind %s; anonymous clients %s",
            cfg.bind,
            _anonymous_mode(self._configured_anonymous, cfg.bind),
        )
        self.authorizer = Authorizer(
            default_allow=cfg.acl_default == "allow", groups_of=self.users.groups_of
        )
        self.sync = CatalogSync(self.catalog, self.router)
        self.sync.on_change.append(self.users.refresh)
        self.sync.on_change.append(self.tokens.refresh)
        self.sync.on_change.append(self._refresh_acls)  # after the users: their groups
        await self.sync.refresh()
        self.sync.start()
        log.info(
            "authorization: %d ACL rules; what no rule matches is %s (acl_default %s)",
            len(self.authorizer.rules),
            "allowed" if self.authorizer.default_allow else "denied",
            cfg.acl_default,
        )

        self.admin_token, self.token_generated = load_or_create_token(
            cfg.admin_token, self.data_dir
        )
        if self.token_generated:
            print(
                f"flowmq: generated admin token {self.admin_token} "
                f"(kept in {self.data_dir / 'admin_token'}; shown only this once)",
                flush=True,
            )
        await self._start_cluster_links()
        await self._start_gossip(gossip_tuning)
        self.nodes_registry = NodeRegistry(
            self.meta,
            self.node_id,
            {
                "roles": cfg.roles,
                "ports": self.ports,
                "version": flowmq_version(),
                **({"advertised_host": cfg.advertised_host} if cfg.advertised_host else {}),
            },
            former_id=self.data_dir_lock.former_id,
        )
        self.readiness = Readiness(self.node_id, self.meta, self.objects, self._cluster_state)
        self.group_admin = GroupAdmin(
            self.meta, self.catalog, self.streams, lambda: self.kafka, self.nodes
        )
        self.group_admin.start()
        self.services = BrokerServices(
            config=cfg,
            node_id=self.node_id,
            meta=self.meta,
            objects=self.objects,
            router=self.router,
            catalog=self.catalog,
            sync=self.sync,
            streams=self.streams,
            queues=self.queues,
            users=self.users,
            authorizer=self.authorizer,
            cluster=self.cluster,
            nodes=self.nodes,
            metadata_changed=self.metadata_changed,
            connection_limits=ConnectionLimits(
                cfg.max_connections, cfg.max_connections_per_address
            ),
            pressure=self.pressure,
        )
        for role in cfg.roles:
            if role in PROTOCOL_ADAPTERS:
                await self._start_adapter(role)
        if self.tls is not None:
            await self._start_tls_listeners(self.tls)
        if self.mqtt is not None:
            await self._start_mqtt_websocket(self.mqtt, self.tls)
        await self.nodes_registry.start()
        await self._serve_http(http_sockets)
        if self.tls is not None:
            await self._serve_https(self.tls)
        self.maintenance.start()
        if cfg.memory_limit:
            self.memory_budget = MemoryBudget(cfg.memory_limit, self.pressure)
            self.memory_watch = PeriodicTask(
                "memory-limit", MEMORY_CHECK_INTERVAL_S, self.memory_budget.check
            )
            self.memory_watch.start()
        self.heap_trim = PeriodicTask("heap-trim", HEAP_TRIM_INTERVAL_S, _trim_heap)
        self.heap_trim.start()
        self._write_ports()
        if self.gossip is not None:
            self.gossip.update_meta({"roles": cfg.roles, "ports": self.ports})
        log.info(
            "node %s ready: %s", self.node_id, ", ".join(f"{k}={v}" for k, v in self.ports.items())
        )

    def _bind_http(self) -> list[socket.socket]:
        """Bind the HTTP port first: a node id may be derived from it.  It serves only once
        the broker is ready (``_serve_http``).  In host mode (``reuse_port``) the port is
        shared by the host's processes, so each also binds a port of its own (any free one),
        which ``ports`` names: the admin API's per-process views (clients, metrics) need a
        way to reach one process."""
        cfg = self.config
        sockets: list[socket.socket] = []
        try:
            sockets.append(bind_socket(cfg.bind, cfg.http_port, reuse_port=cfg.reuse_port))
            if cfg.reuse_port:
                sockets.append(bind_socket(cfg.bind, 0))
        except OSError as exc:
            for sock in sockets:
                sock.close()
            raise StartupError(
                f"cannot listen on HTTP port {cfg.http_port}: {exc.strerror}"
            ) from None
        self.ports["http"] = sockets[-1].getsockname()[1]
        return sockets

    async def _serve_http(self, sockets: list[socket.socket]) -> None:
        app = create_app(self, self.admin_token, admin="admin" in self.config.roles)
        # Room for any URL a client may send, so that a topic past MAX_TOPIC_BYTES is refused
        # by our own check inside the JSON envelope, not by aiohttp's 8 KiB request line
        # (a plain-text 400 no client of the API expects).
        # The access log (``http_access_log``): aiohttp's, one line per request at info on
        # ``aiohttp.access``, without the Authorization header.
        access_log = web_log.access_logger if self.config.http_access_log else None
        self._runner = web.AppRunner(
            app, access_log=access_log, handle_signals=False, max_line_size=256 * 1024
        )
        await self._runner.setup()
        for sock in sockets:
            await web.SockSite(self._runner, sock).start()

    def _node_key(self) -> str:
        """A name unique to this process for the objects it writes (node ids may be derived
        from the HTTP port, which is not known yet)."""
        return self.config.node_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"

    async def _start_gossip(self, tuning: GossipConfig) -> None:
        """Join the cluster's SWIM membership (DESIGN.md §6).  Routing does not use it yet:
        it tells which brokers are alive (cluster nodes API, gossip_cluster_size)."""
        cfg = self.config
        self.gossip = Gossip(
            self.node_id,
            bind=(cfg.cluster_bind, cfg.gossip_port),
            seeds=cfg.seeds,
            config=tuning,
            # The link port from the start: a peer routes to us only once it knows it.
            meta={"roles": cfg.roles, "ports": {"cluster": self.ports["cluster"]}},
            advertise=(_cluster_advertised_host(cfg.cluster_bind), 0),
            secret=self.cluster_secret,
        )
        self.gossip.on_member_change = self._member_changed
        self.gossip.on_event = self._gossip_event
        try:
            _, self.ports["gossip"] = await self.gossip.start()
        except OSError as exc:
            raise StartupError(
                f"cannot listen on gossip port {cfg.gossip_port}: {exc.strerror}"
            ) from None
        metrics.gossip_cluster_size.set(len(self.gossip.members()))
        log.info(
            "cluster plane on %s: %s",
            cfg.cluster_bind,
            "gossip and links authenticated by the cluster secret"
            if self.cluster_secret is not None
            else "open, no cluster secret (loopback only)",
        )

    async def _start_cluster_links(self) -> None:
        """Cross-node routing: links to the peers, this node's Subscription routes."""
        assert self.cluster is not None
        try:
            self.ports["cluster"] = await self.cluster.start(self.config.cluster_port, self.router)
        except OSError as exc:
            raise StartupError(
                f"cannot listen on cluster port {self.config.cluster_port}: {exc.strerror}"
            ) from None

    def _announce_routes(self, token: str, seq: int) -> None:
        """Route changes are pushed to peers over the links; gossip tells them too, so a
        peer the push missed catches up within a gossip round rather than at anti-entropy."""
        self._announce(ROUTES_EVENT, {"token": token, "seq": seq})

    def _live_peers(self) -> list[tuple[str, str, int | None]]:
        """Live gossip members with the address of their inter-broker link."""
        if self.gossip is None:
            return []
        return [
            (m.node_id, m.addr[0], m.meta.get("ports", {}).get("cluster"))
            for m in self.gossip.members()
        ]

    def _member_changed(self, member: Member, old: Status | None, new: Status) -> None:
        assert self.gossip is not None
        metrics.gossip_cluster_size.set(len(self.gossip.members()))
        if self.cluster is not None:
            self.cluster.set_members(self._live_peers())
        if old != new:
            log.info("cluster member %s: %s -> %s", member.node_id, old and old.value, new.value)

    async def _start_adapter(self, role: str) -> None:
        """Start a protocol adapter: ``factory(services)``, ``await start(port) -> bound
        port``, ``await stop()``.  Adapters reach the shared parts only through
        ``BrokerServices``."""
        module_name, factory_name, port_key = PROTOCOL_ADAPTERS[role]
        factory: Any = importlib.import_module(module_name)
        for part in factory_name.split("."):
            factory = getattr(factory, part)
        adapter = factory(self.services)
        port = getattr(self.config, port_key)
        try:
            self.ports[role] = await adapter.start(port)
        except OSError as exc:
            raise StartupError(f"cannot listen on {role} port {port}: {exc.strerror}") from None
        self.adapters[role] = adapter

    async def _start_tls_listeners(self, tls: ServerTls) -> None:
        """Each adapter's TLS port (``<role>_tls_port``, in ports.json ``<role>_tls``), with
        the one context of ``tls``; before the node table entry, which tells Kafka's
        ``kafka_tls`` to the other brokers."""
        for role, adapter in self.adapters.items():
            key = f"{role}_tls"
            port = getattr(self.config, f"{key}_port")
            try:
                self.ports[key] = await adapter.start_tls(port, tls)
            except OSError as exc:
                raise StartupError(f"cannot listen on {key} port {port}: {exc.strerror}") from None

    async def _start_mqtt_websocket(self, mqtt: MqttServer, tls: ServerTls | None) -> None:
        """MQTT over WebSocket (``mqtt_ws_port``, ports.json ``mqtt_ws``) and, with TLS,
        over secure WebSocket (``mqtt_wss_port``, ``mqtt_wss``)."""
        sites = [("mqtt_ws", None)] + ([("mqtt_wss", tls)] if tls is not None else [])
        for key, secure in sites:
            port = getattr(self.config, f"{key}_port")
            try:
                self.ports[key] = await mqtt.start_websocket(port, secure)
            except OSError as exc:
                raise StartupError(f"cannot listen on {key} port {port}: {exc.strerror}") from None

    async def _serve_https(self, tls: ServerTls) -> None:
        """The admin API, HTTP publish and metrics over TLS (``http_tls_port``, in
        ports.json ``http_tls``): the app ``_serve_http`` set up, on a second site."""
        assert self._runner is not None
        port = self.config.http_tls_port
        try:
            sock = bind_socket(self.config.bind, port, reuse_port=self.config.reuse_port)
        except OSError as exc:
            raise StartupError(f"cannot listen on http_tls port {port}: {exc.strerror}") from None
        self.ports["http_tls"] = sock.getsockname()[1]
        await web.SockSite(self._runner, sock, ssl_context=tls.context).start()

    def _write_ports(self) -> None:
        path = self.data_dir / "ports.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"node_id": self.node_id, **self.ports}, indent=2) + "\n")
        os.replace(tmp, path)

    async def stop(self) -> None:
        """Stop in the reverse order of start; a step that fails is logged and the rest
        still run, so the meta store is closed (and its lock released) whatever happens."""
        self.stopping = True  # readiness answers 503 from now on
        if self.gossip is not None:
            await _logged("leave the cluster", self.gossip.stop(leave=True))
        for role, adapter in list(self.adapters.items()):
            await _logged(f"stop the {role} adapter", adapter.stop())
        if self.cluster is not None:
            self.router.forwarder = None
            await _logged("stop cross-node routing", self.cluster.stop())
        # The rest stop the same way: each present part's stop or close, in this order.
        parts: list[tuple[str, Any, str]] = [
            ("stop stream maintenance", self.maintenance, "stop"),
            ("stop the memory check", self.memory_watch, "stop"),
            ("stop the heap trim", self.heap_trim, "stop"),
            ("stop the queues", self.queues, "stop"),
            ("flush group offset resets", self.group_admin, "close"),
            ("stop the catalog sync", self.sync, "stop"),
            ("flush the batcher", self.batcher, "close"),
            ("remove the node entry", self.nodes_registry, "stop"),
            ("stop the HTTP listener", self._runner, "cleanup"),
            ("close the object store", self.objects, "close"),
            ("close the meta store", self.meta, "close"),
        ]
        for what, part, method in parts:
            if part is not None:
                await _logged(what, getattr(part, method)())
        self.data_dir_lock.release()


async def _logged(what: str, step: Awaitable[Any]) -> None:
    try:
        await step
    except Exception:
        log.exception("could not %s", what)


async def _trim_heap() -> None:
    trim_heap()
