"""Cross-node routing of Subscription messages (DESIGN.md §4, §6).

Streams and Queues are stored once in shared storage, so any broker serves them.  Subscribers
are in some broker's memory: each broker announces the filters it has local subscribers on as
routes ``(node, namespace, filter)`` in the meta store, pushes every change to its peers over
the inter-broker links (and waits for them to apply it before a SUBACK goes out), and checks
every second that it applied every peer's latest version (anti-entropy).

A published message goes to each remote node with a matching route once, whatever the number
of subscribers there; that node fans it out to its own subscribers.  Plain QoS 0 MQTT
messages go a read at a time (DESIGN.md §11): what one client's read published for a node
goes in one ``fwdr`` frame, ``[namespace, origin client, protocol level, runs]``, each run
``topic, count, payload bytes, PUBLISH packets`` flattened into ``runs``: the packets as the
client sent them, joined, which the receiving node writes as they are to its subscribers of
that protocol level (``on_forwarded_runs``, the MQTT adapter's), one write per subscriber.  A shared subscription
group spread over several nodes gets each message on one of them (round robin over nodes).
When a node dies, one survivor adopts what it left (its MQTT sessions, with their routes) and
then clears its routes from the meta store; until then every broker keeps the dead node's
routes and refuses a QoS 1/2 message that matches one (the publisher sends it again), so that
no message for a persistent session is acknowledged while no node holds that session.
Likewise a node that hands a session over to another (``hand_over``) keeps its route until
every live peer has read the new holder's routes.

A QoS 1/2 message forwarded to another node is acknowledged to its publisher only once every
receiving node confirmed it (delivered to its connected subscribers, stored for the offline
ones).  A receiver that dies, restarts, loses its link or does not answer in time fails the
forward (``NotStored``): the publisher is refused and sends it again; nothing is acknowledged
on a guess.  A node that finds its own routes cleared was declared dead by the others (a
pause, a partition): its sessions were adopted elsewhere, so it ends them here (``on_fenced``)
and announces its routes afresh.  It finds out by anti-entropy, or at its next route write:
route versions are written only over this start's own (the start token fences them), so a
node that was declared dead never writes its old routes back as if nothing had happened.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import flowmq_metrics as metrics
from flowmq_broker.routing import Router
from flowmq_cluster.auth import ClusterSecret
from flowmq_cluster.link import Link, Links
from flowmq_core.errors import FlowMQError
from flowmq_core.message import Message
from flowmq_core.message_codec import decode_message, encode_message
from flowmq_core.periodic import PeriodicTask
from flowmq_core.trie import RouteTrie
from flowmq_meta import keys
from flowmq_meta.api import MetaStore

log = logging.getLogger(__name__)

ANTI_ENTROPY_S = 1.0
# Frame kinds newer than the links' first version that this node takes (``Links.supports``):
# a peer on older code is sent each message as a ``fwd`` frame of its own instead.
RUNS = "fwdr"
LINK_FEATURES = (RUNS,)
# A forwarded QoS 1/2 message's publisher waits for the receiving nodes' confirmation at
# most this long (a reply lost with a broken link must not hold it for ever).
FORWARD_CONFIRM_TIMEOUT_S = 5.0
# How long a SUBACK waits for peers to apply the new route: a peer that is dead but not yet
# declared so must not hold subscribers up for longer; anti-entropy repairs what it missed.
ROUTE_ACK_TIMEOUT_S = 1.0
SHARE_PREFIX = "$share/"
# How long a restarted node keeps its previous process's routes while its adapters restore
# the persistent sessions they were for.
RESTORE_GRACE_S = 10.0
# At its start a node holds the routes of peers it has not seen alive yet as a dead node's,
# refusing what matches them, for at most this long: gossip sees a live peer within seconds;
# one still unseen by then is taken for gone (as before the hold: its routes are forgotten).
UNSEEN_HOLD_S = 30.0
# A dead node whose sessions were not adopted (a record named another process of it, one we
# did not know of) is looked at again after this long: if it is still gone, that process is
# gone too, and its sessions are adopted (until then its routes stay, refusing).
ADOPT_RETRY_S = 5.0
# A route handed over with a session (``hand_over``) stays at most this long for peers that
# do not say they read the new holder's routes (one that is alive answers within a second or
# two; a dead one is declared so within about 5 s and is not asked any more).
HAND_OVER_LIMIT_S = 30.0


class _Fenced(Exception):
    """This node's routes were cleared by a survivor: it was declared dead meanwhile."""


class NotStored(FlowMQError):
    """A node a QoS 1/2 message was forwarded to could not store it for an offline session."""

    code = "destination_unavailable"


RemoteRoute = tuple[str, str | None]  # (node, shared group route filter or None)
FrameHandler = Callable[[Link, list[Any]], None]
RequestHandler = Callable[[list[Any]], Any]


class _Request:
    """Replies awaited from peers for one request; ``failed``: the peers that will not answer."""

    def __init__(self, peers: set[str], failed: set[str] | None = None) -> None:
        self.waiting = peers
        self.failed: set[str] = failed or set()
        self.replies: list[Any] = []
        self.request_id = 0
        self.timeout = 0.0
        loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = loop.create_future()
        self.started = loop.time()

    def answered(self, peer: str, value: Any) -> None:
        if peer in self.waiting:
            self.waiting.discard(peer)
            self.replies.append(value)
        self.check()

    def fail(self, peer: str) -> None:
        if peer in self.waiting:
            self.waiting.discard(peer)
            self.failed.add(peer)
        self.check()

    def check(self) -> None:
        if not self.waiting and not self.done.done():
            self.done.set_result(None)


@functools.cache
def _forwarded(namespace: str) -> Any:
    return metrics.broker_messages_forwarded_count.labels(namespace)


def _route_parts(route_filter: str) -> tuple[str, str | None]:
    """The trie filter of a route and its shared group name (the route filter itself)."""
    if route_filter.startswith(SHARE_PREFIX):
        return route_filter.split("/", 2)[2], route_filter
    return route_filter, None


class ClusterRouting:
    """This broker's side of cross-node routing; the Router calls ``forward`` on publish."""

    def __init__(
        self,
        node_id: str,
        meta: MetaStore,
        *,
        members: Callable[[], Iterable[tuple[str, str, int | None]]] | None = None,
        on_routes_changed: Callable[[str, int], None] | None = None,
        bind: str = "127.0.0.1",
        secret: ClusterSecret | None = None,
    ) -> None:
        self.node_id = node_id
        self.meta = meta
        # Where the live peers come from (gossip); anti-entropy re-reads it every second.
        self.member_source = members
        # Told of each committed route version (the broker gossips it).
        self.on_routes_changed = on_routes_changed
        # Where forwarded messages are delivered here: the router that forwards through us,
        # given at ``start`` (it is built with this forwarder).
        self.router: Router | None = None
        # The link listener binds ``bind``; with a secret every link is authenticated first.
        self.links = Links(
            node_id, self._on_frame, host=bind, secret=secret, features=LINK_FEATURES
        )
        self.links.on_blocked = self._link_blocked
        self.links.on_peer_lost = self._peer_lost
        self.links.on_peer_ready = self._peer_ready
        # Flow control (the MQTT adapter sets these): a forward just went into a blocked
        # link — slow the publisher down; no link is blocked any more — let it go.  (A
        # forwarded message is delivered with the link it came in on as its source.)
        self.on_links_blocked: Callable[[], None] | None = None
        self.on_links_free: Callable[[], None] | None = None
        # Where ``fwdr`` frames (runs of plain QoS 0 MQTT PUBLISH packets) are delivered
        # here: (link, namespace, origin, protocol level, runs); the MQTT adapter sets it.
        self.on_forwarded_runs: Callable[[Link, str, str, int, list[Any]], None] | None = None
        self._answering: Link | None = None  # the link of the request being handled
        # one-way frames [kind, …] and requests [kind, request id, …] answered by
        # ["reply", request id, value]; a request handler may return an awaitable
        self.handlers: dict[str, FrameHandler] = {
            "fwd": self._on_forward,
            RUNS: self._on_forwarded_runs,
            "reply": self._on_reply,
        }
        self.requests: dict[str, RequestHandler] = {
            "route": self._on_route,
            "fwdq": self._on_confirmed_forward,
            "routes?": self._on_routes_wanted,
        }
        self.token = secrets.token_hex(8)
        # local routes: reference counts of (namespace, route filter), changes not yet out
        self._local: dict[tuple[str, str], int] = {}
        self._dirty: dict[tuple[str, str], bool] = {}
        self._seq = 0
        self._publishing: asyncio.Task[None] | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self._pending: dict[int, _Request] = {}
        self._requests = itertools.count(1)
        # remote routes: per namespace a trie of (node, group), and what each node announced
        self.remote: dict[str, RouteTrie[RemoteRoute]] = {}
        self._node_routes: dict[str, set[tuple[str, str]]] = {}
        self._applied: dict[str, tuple[str, int]] = {}  # node -> (token, seq)
        # Dead nodes whose routes are kept (and refused) until cleared: node -> token or None
        self._dead: dict[str, str | None] = {}
        # Route reads of each node: the one under way, and the one asked for meanwhile.
        self._reloading: dict[str, list[asyncio.Future[None]]] = {}
        self._reload_tasks: set[asyncio.Task[None]] = set()
        self._live: dict[str, tuple[str, int]] = {}  # node -> link address
        self._turn = itertools.count()
        self._poll = PeriodicTask("route-anti-entropy", ANTI_ENTROPY_S, self.anti_entropy)
        # What else the survivor that cleans up after a dead node takes over (MQTT sessions).
        # Called with the node and the process of it that died (its links' incarnation, or
        # None): what it held belongs to that process only (a restart reclaims it).  False:
        # another process of it still holds something, so its routes are not cleared.
        self.on_node_dead: list[Callable[[str, str | None], Awaitable[bool]]] = []
        # Called when this node finds it was declared dead and its sessions adopted elsewhere
        # (awaited if it returns an awaitable), before its routes are announced afresh.
        self.on_fenced: list[Callable[[], Awaitable[Any] | None]] = []
        self._rejoining: asyncio.Task[None] | None = None
        # Route versions are written one at a time: a rejoin's new token is never overwritten
        # by a batch that read the old one.
        self._route_writes = asyncio.Lock()

    # --- life cycle ---------------------------------------------------------------------------
    async def start(self, port: int, router: Router) -> int:
        """Listen for peers and start this node's routes afresh; deliver what peers forward
        through ``router``.  A restart's old routes stay for ``RESTORE_GRACE_S``: the
        persistent sessions they were for are being restored here (until then a forward
        for them is refused, not lost), and those not restored by then go."""
        self.router = router
        bound = await self.links.start(port=port)
        begin, end = keys.ROUTES.range(self.node_id)
        version_key = keys.ROUTE_VERSIONS.pack(self.node_id)

        def reset(tr: Any) -> list[tuple[bytes, bytes]]:
            tr.set(version_key, json.dumps({"token": self.token, "seq": 0}).encode())
            return tr.get_range(begin, end)

        previous = await self.meta.transact(reset)
        if previous:
            stale = [tuple(keys.ROUTES.unpack(key)[1:]) for key, _ in previous]
            asyncio.get_running_loop().call_later(RESTORE_GRACE_S, self._drop_stale, stale)
        await self._hold_unseen_routes()
        await self.anti_entropy()
        self._poll.start()
        return bound

    async def _hold_unseen_routes(self) -> None:
        """Every peer's routes in the meta store, held as a dead node's (refusing) until
        gossip here sees the peer alive, when they are read afresh (``set_members``).  The
        client listeners open before gossip has found the peers: their routes read only once
        seen alive, a QoS 1 message for a persistent session on another node matched no
        route meanwhile and was PUBACKed without being stored for it (the chaos run at
        d9f9928 lost 22 and 10 so, within 1.5 s of a restart of the publisher's node)."""
        versions_range, routes_range = keys.ROUTE_VERSIONS.range(), keys.ROUTES.range()

        def read(tr: Any) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
            return tr.get_range(*versions_range), tr.get_range(*routes_range)

        version_rows, route_rows = await self.meta.transact(read)  # one read for every peer
        routes: dict[str, set[tuple[str, str]]] = {}
        for key, _ in route_rows:
            node, *route = keys.ROUTES.unpack(key)
            routes.setdefault(node, set()).add(tuple(route))  # type: ignore[arg-type]
        held: list[tuple[str, str]] = []
        for key, raw in version_rows:
            node = keys.ROUTE_VERSIONS.unpack(key)[0]
            if node == self.node_id or node in self._live or node in self._dead:
                continue
            token = json.loads(raw)["token"]
            self._hold_refusing(node, routes.get(node, set()), token)
            held.append((node, token))
        if held:
            asyncio.get_running_loop().call_later(UNSEEN_HOLD_S, self._release_unseen, held)

    def _release_unseen(self, held: list[tuple[str, str]]) -> None:
        """Forget the held routes of peers still not seen alive (``_hold_unseen_routes``)."""
        for node, token in held:
            if node not in self._live and self._dead.get(node) == token:
                log.info("node %s not seen alive since this node started: routes forgotten", node)
                self._forget_dead(node)

    def _drop_stale(self, routes: list[tuple[str, str]]) -> None:
        """Remove the routes of this node's previous process that nothing here took up."""
        for key in routes:
            if key not in self._local and key not in self._dirty:
                self._changed(key, False)  # type: ignore[arg-type]

    async def stop(self) -> None:
        """Leave: take this node's routes out of the meta store so nobody forwards here."""
        await self._poll.stop()
        if self._publishing is not None:
            self._publishing.cancel()
        try:
            await self._clear_node(self.node_id, self.token)
        except Exception:
            log.exception("could not remove this node's routes")
        await self.links.stop()

    # --- membership -----------------------------------------------------------------------
    def set_members(self, members: Iterable[tuple[str, str, int | None]]) -> None:
        """The live peers as ``(node, host, link port)``: links follow, the dead are dropped."""
        live = {node: (host, port) for node, host, port in members if port and node != self.node_id}
        for node in list(self._live):
            if node not in live:
                self.node_gone(node)
        for node, addr in live.items():
            if node not in self._live:
                self._dead.pop(node, None)  # back: its routes are read afresh
                self._reload_soon(node)
            self.links.set_peer(node, addr)
        self._live = live

    def node_gone(self, node: str) -> None:
        """``node`` died or left: stop sending to it (what waits for its answer fails); its
        routes stay, refusing, until the lowest live node adopted its sessions and cleared
        them."""
        self._live.pop(node, None)
        process = self.links.incarnation_of(node)  # the process that died, if we reached it
        self.links.remove_peer(node)
        applied = self._applied.pop(node, None)
        token = applied[0] if applied is not None else None
        if node in self._node_routes:
            self._dead[node] = token
        self._peer_lost(node)
        if min([self.node_id, *self._live]) == self.node_id:
            asyncio.get_running_loop().create_task(self._clear_dead(node, token, process))

    def _peer_lost(self, node: str) -> None:
        """No answer will come from ``node`` to what was sent so far; if it restarted, the
        routes we hold are its previous process's: read them afresh."""
        for request in list(self._pending.values()):
            request.fail(node)
        if node in self._live:
            self._reload_soon(node)
        self._peer_ready(node)  # no link: what it takes is unknown until the next one

    def _peer_ready(self, node: str) -> None:
        """What ``node``'s process takes (``remote_nodes``) may have changed."""
        if self.router is not None:
            self.router.remote_routes_changed()

    def _hold_refusing(self, node: str, routes: set[tuple[str, str]], token: str) -> None:
        """Route ``node``'s ``routes`` (of its start ``token``) as a dead node's: what matches
        them is refused, not acknowledged, until it is seen alive or a survivor clears them."""
        self._set_node_routes(node, routes)
        self._dead[node] = token

    def _forget_dead(self, node: str) -> None:
        if node in self._dead:
            del self._dead[node]
            self._set_node_routes(node, set())

    async def _clear_dead(self, node: str, token: str | None, process: str | None) -> None:
        """Adopt what a gone node left, announce the adopted sessions' routes, then remove
        its routes (``token``: its start as we knew it; None if we never read its routes;
        ``process``: its links' incarnation, None if we never reached it)."""
        try:
            if node in self._live or not await self._still_gone(node, token):
                return  # it restarted meanwhile and owns its routes again
            held = [await adopt(node, process) for adopt in self.on_node_dead]
            if False in held:  # a process of it holds sessions: not gone, its routes stay
                log.info("node %s still holds sessions (another process of it): kept", node)
                if process is not None:  # looked at again, for any process of it
                    asyncio.get_running_loop().call_later(
                        ADOPT_RETRY_S, self._retry_clear_dead, node, token
                    )
                return
            routed = self.routes_published()
            if routed is not None:
                await routed
            if await self._clear_node(node, token):
                log.info("node %s is gone: its sessions are adopted, its routes removed", node)
                self._forget_dead(node)
        except Exception:
            log.exception("could not take over from dead node %s", node)

    def _retry_clear_dead(self, node: str, token: str | None) -> None:
        """``_clear_dead`` again for a node whose sessions another process of it held, any
        process of it now: still gone after ``ADOPT_RETRY_S``, that one is gone too (its
        clients' messages were refused meanwhile, until the node came back or a client
        reconnected elsewhere)."""
        if node not in self._live and min([self.node_id, *self._live]) == self.node_id:
            asyncio.get_running_loop().create_task(self._clear_dead(node, token, None))

    async def _still_gone(self, node: str, token: str | None) -> bool:
        """False if ``node`` has written routes of a start other than ``token`` since."""
        raw = await self.meta.transact(lambda tr: tr.get(keys.ROUTE_VERSIONS.pack(node)))
        return raw is None or token is None or json.loads(raw)["token"] == token

    async def _clear_node(self, node: str, token: str | None) -> bool:
        """Clear ``node``'s routes if they are still those of its start ``token`` (a node that
        restarted meanwhile has written new ones); True if they are gone (cleared now, or by
        the node itself when it left)."""
        begin, end = keys.ROUTES.range(node)
        version_key = keys.ROUTE_VERSIONS.pack(node)

        def clear(tr: Any) -> bool:
            raw = tr.get(version_key)
            if raw is None:
                return True
            if token is not None and json.loads(raw)["token"] != token:
                return False
            tr.clear_range(begin, end)
            tr.clear(version_key)
            return True

        return await self.meta.transact(clear)

    async def _rejoin(self) -> None:
        """This node's routes were cleared: the others declared it dead (it was paused or cut
        off) and adopted its sessions.  End them here (their clients reconnect and take them
        over from the adopter), then announce this node's routes under a new start token.
        Found by anti-entropy and by a route write (``_Fenced``) alike: one rejoin at a time."""
        if self._rejoining is None:
            self._rejoining = asyncio.get_running_loop().create_task(self._rejoin_once())
        rejoining = self._rejoining
        try:
            await asyncio.shield(rejoining)
        finally:
            if rejoining.done() and self._rejoining is rejoining:
                self._rejoining = None

    async def _rejoin_once(self) -> None:
        log.warning(
            "node %s was declared dead meanwhile; its sessions live elsewhere now", self.node_id
        )
        for fenced in self.on_fenced:
            ended = fenced()
            if inspect.isawaitable(ended):
                await ended
        async with self._route_writes:
            self.token = secrets.token_hex(8)
            self._seq = 0
            routes = list(self._local)
            begin, end = keys.ROUTES.range(self.node_id)
            version_key = keys.ROUTE_VERSIONS.pack(self.node_id)
            version = json.dumps({"token": self.token, "seq": 0}).encode()

            def reset(tr: Any) -> None:
                tr.clear_range(begin, end)
                for namespace, route_filter in routes:
                    tr.set(keys.ROUTES.pack(self.node_id, namespace, route_filter), b"")
                tr.set(version_key, version)

            await self.meta.transact(reset)
        if self.on_routes_changed is not None:
            self.on_routes_changed(self.token, 0)

    # --- local routes ------------------------------------------------------------------------
    def local_added(self, namespace: str, route_filter: str) -> None:
        key = (namespace, route_filter)
        count = self._local.get(key, 0)
        self._local[key] = count + 1
        if count == 0:
            self._changed(key, True)

    def local_removed(self, namespace: str, route_filter: str) -> None:
        key = (namespace, route_filter)
        count = self._local.get(key, 0)
        if count <= 1:
            self._local.pop(key, None)
            if count == 1:
                self._changed(key, False)
        else:
            self._local[key] = count - 1

    def hand_over(self, namespace: str, route_filter: str, to_node: str) -> None:
        """``local_removed`` for a subscriber whose session ``to_node`` takes over: the route
        stays until every live peer routes that node's filters as the meta store has them
        now (its placeholder's, ``MqttServer.fetch_session``), or refuses them (a node not
        seen alive yet).  A forward that comes here meanwhile is refused (``_holds``) and
        sent again.  Removed at once, a peer that had not applied the new holder's routes
        yet (its push not answered in time, the node not seen alive since a pause) had the
        filter routed nowhere, and acknowledged what it published then without storing it."""
        key = (namespace, route_filter)
        self._local[key] = self._local.get(key, 0) + 1  # held by the hand-over
        self.local_removed(namespace, route_filter)
        task = asyncio.get_running_loop().create_task(self._routes_seen_everywhere(to_node))
        task.add_done_callback(lambda _: self.local_removed(namespace, route_filter))

    async def _routes_seen_everywhere(self, node: str) -> None:
        """Until every live peer read ``node``'s routes since this was called (each is asked
        again after a failure; a peer declared dead meanwhile is not asked any more)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HAND_OVER_LIMIT_S
        while True:
            request = self._request(["routes?", node], ROUTE_ACK_TIMEOUT_S)
            if request is not None:
                await self._replies(request, "routes?")
            if request is None or (not request.failed and all(request.replies)):
                return
            if loop.time() > deadline:
                log.warning("peers %s did not read the routes of %s", sorted(request.failed), node)
                return
            await asyncio.sleep(ANTI_ENTROPY_S)

    def _on_routes_wanted(self, args: list[Any]) -> Any:
        """A peer lets a session go to ``node``: answered True once ``node``'s routes are
        read afresh here (``routes_read``)."""
        return self.routes_read(args[0])

    async def routes_read(self, node: str) -> bool:
        """Apply ``node``'s routes as the meta store has them now: as a live node's, or, if
        it is not seen alive here (it resumed after a pause and gossip has not said so
        yet), as a dead one's, refusing, until it is (``set_members``) or a survivor
        clears them.  Ignored, they left a session it took over routed nowhere here."""
        if node == self.node_id:
            return True
        if node in self._live:
            await self._reload_soon(node)
            return True
        version, routes = await self._read_routes(node)
        if node in self._live:
            await self._reload_soon(node)
        elif version is not None:
            if node not in self._dead:
                log.info("node %s: its routes are refused until it is seen alive", node)
            self._hold_refusing(node, routes, version["token"])
        return True

    def _changed(self, key: tuple[str, str], present: bool) -> None:
        self._dirty[key] = present
        if self._publishing is None:
            self._publishing = asyncio.get_running_loop().create_task(self._publish_routes())

    def routes_published(self) -> asyncio.Future[None] | None:
        """A future done once the route changes made so far are out (None: nothing pending,
        or no peer to tell)."""
        if self._publishing is None or not self._live:
            return None
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    async def _publish_routes(self) -> None:
        try:
            while self._dirty:
                dirty, self._dirty = self._dirty, {}
                waiters, self._waiters = self._waiters, []
                try:
                    await self._publish_batch(dirty)
                except _Fenced:
                    # Declared dead meanwhile: rejoin (which writes every local route under
                    # a new token), then these changes go out under it.
                    self._dirty = {**dirty, **self._dirty}
                    self._waiters = waiters + self._waiters
                    try:
                        await self._rejoin()
                    except Exception:
                        log.exception("could not rejoin the cluster; retrying")
                        await asyncio.sleep(ANTI_ENTROPY_S)
                    continue
                except Exception:
                    # The meta store is unreachable: keep the changes for the next attempt.
                    log.exception("could not publish subscription routes; retrying")
                    self._dirty = {**dirty, **self._dirty}
                    self._waiters = waiters + self._waiters
                    await asyncio.sleep(ANTI_ENTROPY_S)
                    continue
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
        finally:
            self._publishing = None
            for waiter in self._waiters:  # cancelled (stop): release whoever waits
                if not waiter.done():
                    waiter.set_result(None)
            self._waiters = []

    async def _publish_batch(self, dirty: dict[tuple[str, str], bool]) -> None:
        """Write ``dirty`` as the next version of this node's routes, then push it to the
        peers.  Raises ``_Fenced`` if the routes are no longer this start's: a survivor
        cleared them (this node was declared dead) — writing them back under the old token
        would hide that, and the sessions adopted elsewhere would stay here as well."""
        async with self._route_writes:
            seq = self._seq + 1
            token = self.token
            version_key = keys.ROUTE_VERSIONS.pack(self.node_id)
            version = json.dumps({"token": token, "seq": seq}).encode()

            def write(tr: Any) -> bool:
                raw = tr.get(version_key)
                if raw is None or json.loads(raw)["token"] != token:
                    return False
                for (namespace, route_filter), present in dirty.items():
                    key = keys.ROUTES.pack(self.node_id, namespace, route_filter)
                    if present:
                        tr.set(key, b"")
                    else:
                        tr.clear(key)
                tr.set(version_key, version)
                return True

            if not await self.meta.transact(write):
                raise _Fenced
            self._seq = seq
        if self.on_routes_changed is not None:
            self.on_routes_changed(token, seq)
        added = [list(k) for k, present in dirty.items() if present]
        removed = [list(k) for k, present in dirty.items() if not present]
        await self.request_all(
            ["route", self.node_id, token, seq, added, removed], ROUTE_ACK_TIMEOUT_S
        )

    async def request_all(self, frame: list[Any], timeout: float) -> list[Any]:
        """Send request ``frame`` ([kind, args…]) to every live peer; the replies that came
        within ``timeout`` (a peer that dies meanwhile is not waited for)."""
        request = self._request(frame, timeout)
        if request is None:
            return []
        await self._replies(request, frame[0])
        return request.replies

    def _request(self, frame: list[Any], timeout: float) -> _Request | None:
        """``frame`` sent to every live peer, the replies awaited for ``timeout`` (a peer it
        could not be sent to has failed); None if there is no live peer."""
        if not self._live:
            return None
        request_id = next(self._requests)
        kind, *args = frame
        sent = {node for node in self._live if self.links.send(node, [kind, request_id, *args])}
        request = _Request(sent, set(self._live) - sent)
        request.timeout = timeout
        if sent:
            self._pending[request_id] = request
        request.request_id = request_id
        return request

    async def _replies(self, request: _Request, kind: str) -> None:
        """Wait for ``request``'s replies, at most its timeout (then the silent peers fail)."""
        try:
            if request.waiting:
                await asyncio.wait_for(asyncio.shield(request.done), request.timeout)
        except TimeoutError:
            log.warning("peers %s did not answer %s in time", sorted(request.waiting), kind)
            request.failed.update(request.waiting)
        finally:
            self._pending.pop(request.request_id, None)

    def _expire_requests(self) -> None:
        now = asyncio.get_running_loop().time()
        for request in list(self._pending.values()):
            if now - request.started > FORWARD_CONFIRM_TIMEOUT_S and request.waiting:
                log.warning("no confirmation from %s in time", sorted(request.waiting))
                for node in list(request.waiting):
                    request.fail(node)

    def _on_reply(self, link: Link, frame: list[Any]) -> None:
        request = self._pending.get(frame[1])
        if request is not None:
            request.answered(link.peer, frame[2])

    # --- remote routes ----------------------------------------------------------------------
    def _set_node_routes(self, node: str, routes: set[tuple[str, str]]) -> None:
        old = self._node_routes.get(node, set())
        for namespace, route_filter in old - routes:
            self._unbind_remote(node, namespace, route_filter)
        for namespace, route_filter in routes - old:
            self._bind_remote(node, namespace, route_filter)
        if routes:
            self._node_routes[node] = routes
        else:
            self._node_routes.pop(node, None)

    def _bind_remote(self, node: str, namespace: str, route_filter: str) -> None:
        trie = self.remote.get(namespace)
        if trie is None:
            trie = self.remote[namespace] = RouteTrie()
        topic_filter, group = _route_parts(route_filter)
        trie.add(topic_filter, (node, group))
        if self.router is not None:
            self.router.remote_routes_changed()

    def _unbind_remote(self, node: str, namespace: str, route_filter: str) -> None:
        trie = self.remote.get(namespace)
        if trie is None:
            return
        topic_filter, group = _route_parts(route_filter)
        trie.remove(topic_filter, (node, group))
        if not len(trie):
            del self.remote[namespace]
        if self.router is not None:
            self.router.remote_routes_changed()

    def _on_route(self, args: list[Any]) -> Any:
        node, token, seq, added, removed = args
        applied = self._applied.get(node)
        if applied is not None and applied[0] == token and applied[1] >= seq:
            return True  # a reload (gossip, anti-entropy) got here first
        if node in self._live and applied == (token, seq - 1):
            routes = set(self._node_routes.get(node, set()))
            routes.difference_update(tuple(k) for k in removed)
            routes.update(tuple(k) for k in added)
            self._set_node_routes(node, routes)
            self._applied[node] = (token, seq)
            return True
        # A gap (or a node we only just heard of): read its whole route set, then confirm.
        return self._reload_soon(node)

    def routes_announced(self, node: str, token: str, seq: int) -> None:
        """Gossip says ``node``'s routes reached version (token, seq): catch up if behind."""
        applied = self._applied.get(node)
        if node in self._live and (applied is None or applied[0] != token or applied[1] < seq):
            self._reload_soon(node)

    def _reload_soon(self, node: str) -> asyncio.Future[None]:
        """Read ``node``'s routes afresh: done once a read that began after this call is
        applied.  A read already under way may be older than what the caller must see (the
        routes a peer awaits before it lets a session go to ``node``, or an adopter's written
        before it cleared a dead node's): the next read, begun once it is done, answers this
        call.  Taken as fresh, a peer let its route go while this node still had ``node``'s
        old ones, and acknowledged what matched neither without storing it."""
        rounds = self._reloading.get(node)
        if rounds is None:  # none under way: one begins now
            loop = asyncio.get_running_loop()
            rounds = self._reloading[node] = [loop.create_future()]
            task = loop.create_task(self._reload_rounds(node, rounds))
            self._reload_tasks.add(task)  # held: the loop keeps only a weak reference
            task.add_done_callback(self._reload_tasks.discard)
        elif len(rounds) == 1:  # one under way: the next begins once it is done
            rounds.append(asyncio.get_running_loop().create_future())
        return rounds[-1]

    async def _reload_rounds(self, node: str, rounds: list[asyncio.Future[None]]) -> None:
        """Read ``node``'s routes until no caller waits for a later read than the last."""
        try:
            while rounds:
                await self._reload(node)
                done = rounds.pop(0)
                if not done.done():
                    done.set_result(None)
        finally:
            for waiting in rounds:  # cancelled (stop): release whoever waits
                if not waiting.done():
                    waiting.set_result(None)
            if self._reloading.get(node) is rounds:
                del self._reloading[node]

    async def _read_routes(self, node: str) -> tuple[dict[str, Any] | None, set[Any]]:
        """``node``'s route version (None: it has none) and routes, as the meta store has
        them now."""
        begin, end = keys.ROUTES.range(node)
        version_key = keys.ROUTE_VERSIONS.pack(node)

        def read(tr: Any) -> tuple[bytes | None, list[tuple[bytes, bytes]]]:
            return tr.get(version_key), tr.get_range(begin, end)

        raw, rows = await self.meta.transact(read)
        version = json.loads(raw) if raw is not None else None
        return version, {tuple(keys.ROUTES.unpack(key)[1:]) for key, _ in rows}

    async def _reload(self, node: str) -> None:
        try:
            version, routes = await self._read_routes(node)
        except Exception:
            log.exception("could not read the routes of %s", node)
            return
        if node not in self._live:
            return
        if version is None:
            # Cleared by a survivor that took it for dead, though it is alive (a pause): it
            # finds out and announces its routes afresh (``_rejoin``).  Until then those we
            # hold stay: forgotten, a session it took back meanwhile was routed nowhere here
            # (the pause test lost 3 messages so, after a hand-over to it read its routes).
            return
        applied = self._applied.get(node)
        if applied is not None and applied[0] == version["token"] and applied[1] > version["seq"]:
            return  # an update pushed while we read is newer than what we read
        self._set_node_routes(node, routes)
        self._applied[node] = (version["token"], version["seq"])

    async def _restarted_while_dead(self, node: str) -> None:
        """``node``, dead to us, has started again (a new start token) and is not seen alive
        yet.  Its routes in the meta store are its new process's now: those of the previous
        one, kept while it restores their persistent sessions (``start``), and what it added
        since.  They are kept as a dead node's, refusing, until it is seen alive (read afresh
        then) or a survivor clears them.  Forgotten instead (taken for routes a survivor
        cleared), a QoS 1 message for a session being restored there matched no route and
        was acknowledged without being stored on any node."""
        version, routes = await self._read_routes(node)
        if node in self._live or node not in self._dead:
            return  # seen alive meanwhile (its routes are read afresh), or forgotten
        if version is None:
            self._forget_dead(node)
            return
        log.info("node %s restarted: its routes are refused until it is seen alive", node)
        self._hold_refusing(node, routes, version["token"])

    async def anti_entropy(self) -> None:
        """Compare every live peer's route version with the applied one; reload what moved."""
        if self.member_source is not None:
            self.set_members(self.member_source())
        self._expire_requests()
        begin, end = keys.ROUTE_VERSIONS.range()
        token = self.token
        rows = await self.meta.transact(lambda tr: tr.get_range(begin, end))
        versions = {keys.ROUTE_VERSIONS.unpack(key)[0]: json.loads(raw) for key, raw in rows}
        mine = versions.get(self.node_id)
        if (mine is None or mine["token"] != token) and self.token == token:
            await self._rejoin()
        # The live nodes' routes first: a dead node's are forgotten once a survivor adopted
        # its sessions and cleared them, and the adopter's routes for those sessions must be
        # here by then (its push may not have been answered in time), or they are routed
        # nowhere for as long as the reload takes.
        missed = 0
        for node, version in versions.items():
            if node == self.node_id or node not in self._live:
                continue
            applied = self._applied.get(node)
            if applied != (version["token"], version["seq"]):
                behind = applied[1] if applied and applied[0] == version["token"] else 0
                missed += max(1, version["seq"] - behind)
                await self._reload_soon(node)
        if missed:
            metrics.anti_entropy_missing_events_detected_count.inc(missed)
        for node, token in list(self._dead.items()):
            version = versions.get(node)
            if version is None:
                self._forget_dead(node)  # adopted and cleared by a survivor
            elif token is not None and version["token"] != token:
                await self._restarted_while_dead(node)

    # --- forwarding ---------------------------------------------------------------------------
    def forward(
        self, namespace: str, message: Message, bindings: frozenset[Any]
    ) -> tuple[frozenset[Any], asyncio.Future[None] | None]:
        """Send ``message`` once to every remote node with a matching route.  Returns the
        local bindings still to deliver (a shared group may have picked a remote member) and,
        for QoS 1/2, a future done once the receiving nodes confirmed it: delivered to the
        connected subscribers there, stored for the offline persistent ones."""
        trie = self.remote.get(namespace)
        if trie is None:
            return bindings, None
        remote = trie.match(message.topic)
        if not remote:
            return bindings, None
        plain: set[str] = set()
        groups: dict[str, list[str]] = {}
        dead = self._dead
        for node, group in remote:
            if group is None:
                plain.add(node)
            else:
                groups.setdefault(group, []).append(node)
        picked: dict[str, list[str]] = {}
        if groups:
            local_groups = {b.name: b for b in bindings if self.router.is_one_member(b)}
            kept = set(bindings)
            for group, nodes in groups.items():
                candidates = sorted(nodes)
                if dead and len(candidates) > 1:  # a live member takes it if there is one
                    candidates = [n for n in candidates if n not in dead] or candidates
                if group in local_groups:
                    candidates.append(self.node_id)
                chosen = candidates[next(self._turn) % len(candidates)]
                if chosen != self.node_id:
                    picked.setdefault(chosen, []).append(group)
                    kept.discard(local_groups.get(group))
            bindings = frozenset(kept)
        data = encode_message(message)
        confirm = message.qos > 0
        request_id = next(self._requests) if confirm else 0
        sent: set[str] = set()
        unsent: set[str] = set()  # dead, unknown or backlog full: not stored there
        blocked = False
        links = self.links
        for node in plain | picked.keys():
            if node in dead:
                unsent.add(node)
                continue
            groups = picked.get(node, [])
            frame = (
                ["fwdq", request_id, namespace, data, node in plain, groups]
                if confirm
                else ["fwd", namespace, data, node in plain, groups]
            )
            if links.send(node, frame):
                sent.add(node)
                blocked = blocked or links.blocked(node)
            else:
                unsent.add(node)
        if sent:
            _forwarded(namespace).inc(len(sent))
        if blocked and self.on_links_blocked is not None:
            self.on_links_blocked()
        if not confirm or not (sent or unsent):
            return bindings, None
        request = _Request(sent, unsent)
        if sent:
            self._pending[request_id] = request
        else:
            request.check()
        confirmed = asyncio.get_running_loop().create_future()

        def settle(_: Any) -> None:
            self._pending.pop(request_id, None)
            if request.failed:
                confirmed.set_exception(
                    NotStored(f"{', '.join(sorted(request.failed))} did not confirm it")
                )
            elif False in request.replies:
                confirmed.set_exception(NotStored(f"a peer could not store {message.topic!r}"))
            else:
                confirmed.set_result(None)

        request.done.add_done_callback(settle)
        return bindings, confirmed

    def remote_nodes(self, namespace: str, topic: str) -> tuple[list[str], bool]:
        """The nodes with a plain route matching ``topic`` (sorted), and whether its
        messages must go one at a time: a shared group's route on another node matches it
        too (then each message picks a member), or a matching node does not take runs
        (``forward_runs``; older code, or no link up yet)."""
        trie = self.remote.get(namespace)
        if trie is None:
            return [], False
        plain: set[str] = set()
        one_at_a_time = False
        for node, group in trie.match(topic):
            if group is None:
                plain.add(node)
            else:
                one_at_a_time = True
        supports = self.links.supports
        if not one_at_a_time and not all(supports(node, RUNS) for node in plain):
            one_at_a_time = True
        return sorted(plain), one_at_a_time

    def forward_runs(self, node: str, namespace: str, origin: str, level: int, runs: list) -> bool:
        """Send ``node`` one ``fwdr`` frame: ``runs`` of plain QoS 0 PUBLISH packets of
        protocol ``level`` that client ``origin`` published (see the module docstring).  QoS
        0: nothing is confirmed; False if the node cannot take them (dead, unknown, its
        backlog full), and a link that is now blocked is reported as ``forward`` does."""
        links = self.links
        count = sum(runs[1::4])
        frame = [RUNS, namespace, origin, level, runs]
        # by reference: the runs' packets are not copied into the frame (``encode_parts``);
        # nothing changes them (bytes)
        if node in self._dead or not links.send(node, frame, count, by_reference=True):
            return False
        _forwarded(namespace).inc(count)
        if links.blocked(node) and self.on_links_blocked is not None:
            self.on_links_blocked()
        return True

    def _on_forwarded_runs(self, link: Link, frame: list[Any]) -> None:
        _, namespace, origin, level, runs = frame
        if self.on_forwarded_runs is None:  # no MQTT adapter here: no MQTT subscriber either
            log.warning("MQTT messages forwarded by %s to a node without MQTT", link.peer)
            return
        self.on_forwarded_runs(link, namespace, origin, level, runs)

    def _link_blocked(self, link: Link, blocked: bool) -> None:
        if not blocked and self.on_links_free is not None and not self.links.any_blocked():
            self.on_links_free()

    def forward_to_group(self, namespace: str, message: Message, group: str) -> bool:
        """Send ``message`` to one remote node with members of shared ``group``."""
        trie = self.remote.get(namespace)
        if trie is None:
            return False
        nodes = sorted(node for node, g in trie.match(message.topic) if g == group)
        if not nodes:
            return False
        node = nodes[next(self._turn) % len(nodes)]
        frame = ["fwd", namespace, encode_message(message), False, [group]]
        return self.links.send(node, frame)

    def nodes_matching(self, namespace: str, topic: str) -> set[str]:
        """The remote nodes with a route matching ``topic``."""
        trie = self.remote.get(namespace)
        return {node for node, _ in trie.match(topic)} if trie is not None else set()

    def _on_forward(self, link: Link, frame: list[Any]) -> None:
        _, namespace, data, plain, groups = frame
        self._deliver(link, namespace, decode_message(data), plain, groups)

    def _on_confirmed_forward(self, args: list[Any]) -> Any:
        """A QoS 1/2 forward: answered once what it went to is stored (else at once).  One
        that matches no subscriber here was sent along routes this process does not hold
        (it just restarted, or they just went): refused, so that the sender refuses its
        publisher, which sends it again along the routes of now."""
        namespace, data, plain, groups = args
        message = decode_message(data)
        if not self._holds(namespace, message.topic, plain, groups):
            return False
        stored = self._deliver(self._answering, namespace, message, plain, groups)
        if not stored:
            return True

        async def when_stored() -> bool:
            try:
                await asyncio.gather(*stored)
            except Exception as exc:
                log.warning("a forwarded message could not be stored: %s", exc)
                return False
            return True

        return when_stored()

    def _holds(self, namespace: str, topic: str, plain: bool, groups: list[str]) -> bool:
        """Whether a subscriber here matches what a forward was sent for."""
        router = self.router
        for binding in router.match(namespace, topic):
            if router.is_durable(binding):
                continue
            if binding.name in groups if router.is_one_member(binding) else plain:
                return True
        return False

    def _deliver(
        self, link: Link | None, namespace: str, message: Message, plain: bool, groups: list[str]
    ) -> list[Any]:
        return self.router.deliver_forwarded(namespace, message, plain, groups, source=link)

    @property
    def has_peers(self) -> bool:
        return bool(self._live)

    def broadcast(self, frame: list[Any]) -> int:
        """Send ``frame`` to every live peer; returns how many it was queued for."""
        return sum(1 for node in self._live if self.links.send(node, frame))

    def _on_frame(self, link: Link, frame: Any) -> None:
        kind = frame[0] if isinstance(frame, list) and frame else None
        try:
            handler = self.handlers.get(kind)  # type: ignore[arg-type]
            if handler is not None:
                handler(link, frame)
                return
            answer = self.requests.get(kind)  # type: ignore[arg-type]
            if answer is None:
                log.warning("unknown frame from %s: %r", link.peer or "?", str(frame)[:80])
                return
            self._answering = link
            try:
                value = answer(frame[2:])
            finally:
                self._answering = None
            self._answer(link, frame[1], value)
        except Exception:
            log.exception("frame %r from %s failed", kind, link.peer)

    def _answer(self, link: Link, request_id: int, value: Any) -> None:
        if not inspect.isawaitable(value):
            link.send(["reply", request_id, value])
            return

        async def answer_later() -> None:
            try:
                result = await value
            except Exception:
                log.exception("request from %s failed", link.peer)
                result = None
            if link.connected:
                link.send(["reply", request_id, result])

        asyncio.get_running_loop().create_task(answer_later())


__all__ = ["ClusterRouting", "decode_message", "encode_message"]
