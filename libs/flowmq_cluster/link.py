"""Inter-broker links (DESIGN.md §6): one persistent TCP connection per peer, framed, batched.

A frame is one msgpack value; msgpack's streaming unpacker does the framing, so no length
prefix is needed.  Frames sent during one event-loop iteration go out in one write: a broker
forwarding a burst of messages to a peer makes one system call, not one per message.

Either end of a connection may send on it.  A broker sends its own traffic on the connection
it opened to the peer (``Links.send``) and answers requests on the connection they came in on
(``Link.send``), so a reply never waits for a connection to be opened.

Authentication (DESIGN.md §12; wire format in ``flowmq_cluster.auth``): with a cluster secret
each connection starts with a challenge-response in both directions.  Invariants: a frame is
handed to the frame handler only once the peer proved it knows the secret; a frame of ours is
written only once the peer proved it (until then ``Link.send`` holds it); ``Links`` gives out
only links whose handshake completed; a connection that fails the handshake, sends anything
else first, or does not finish it within ``HANDSHAKE_TIMEOUT_S`` is closed and counted.  After
the handshake a frame costs what it cost before: the connection is what was authenticated.
Without a secret (loopback only) each side just says hello with its node id.

Incarnations: each process has a random incarnation id, and the first frame either side sends
once the handshake is done names it.  A link is ready only once the peer's is known.  Frames
queued for a peer while it was unreachable go to the next connection only if that is the same
process: when the peer restarted meanwhile they are dropped and ``Links.on_peer_lost`` says so
(their senders fail what waited for an answer), never delivered to a process that did not
exist when they were sent.  The same callback reports every lost outbound connection: an
answer to a request sent on it can no longer come.

Features: right after its incarnation each side may name the frame kinds it takes beyond the
first version's (``["features", [name, …]]``), so that a node sends a newer kind only to a
peer process that said it takes it; a peer on older code never says so (it logs the frame as
unknown and goes on), and gets the older kinds.  ``Links.supports`` answers for the outbound
link, and ``Links.on_peer_ready`` tells when what it answers may have changed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from functools import partial
from typing import Any

import msgpack

from flowmq_cluster.auth import (
    ACCEPTOR,
    INITIATOR,
    AuthFailure,
    ClusterSecret,
    FailureLog,
    LinkHandshake,
    check_bind,
)

log = logging.getLogger(__name__)

Addr = tuple[str, int]
# Frames queued for a peer that is not (yet) connected, counted by weight (the messages a
# frame carries, see ``Links.send``); past this they are dropped: links carry Subscription
# traffic, which is at-most-once by definition (memory push).
MAX_PENDING_FRAMES = 100_000
RECONNECT_DELAY_S = 0.2
MAX_BUFFER_BYTES = 64 * 1024 * 1024
# Past this much unsent data the link says it is blocked (senders should slow down).
WRITE_HIGH_WATER = 1024 * 1024
# Byte strings at least this long in a frame sent ``by_reference`` go to the socket as they
# are, beside the frame's other bytes, not copied into it (``encode_parts``).
BY_REFERENCE_BYTES = 4096
_HELLO = "hello"
_INCARNATION = "incarnation"
_FEATURES = "features"
# A connection must complete the handshake this fast, in at most this many bytes.
HANDSHAKE_TIMEOUT_S = 5.0
MAX_HANDSHAKE_BYTES = 4096
# After a failed handshake, an outbound link waits this long before it tries again.
RETRY_AFTER_FAILURE_S = 1.0

FrameHandler = Callable[["Link", Any], None]


class Link(asyncio.Protocol):
    """One framed connection; ``peer`` is the node id the other end said hello with.

    ``ready`` resolves once frames may flow (True) or the connection failed before (False).
    """

    def __init__(
        self,
        node_id: str,
        on_frame: FrameHandler,
        on_lost: Callable[[Link], None],
        *,
        role: str = ACCEPTOR,
        secret: ClusterSecret | None = None,
        failures: FailureLog | None = None,
        incarnation: str = "",
        features: tuple[str, ...] = (),
    ):
        self.node_id = node_id
        self.peer = ""
        self.incarnation = incarnation  # this process's
        self.peer_incarnation: str | None = None  # the peer process's, once it said it
        self.features = features  # the frame kinds beyond the first version's we take
        self.peer_features: frozenset[str] = frozenset()  # the peer's, once it said them
        self._features_due = True  # the frame after the incarnation may name them
        self.on_features: Callable[[Link], None] | None = None
        self.address = "?"  # the peer's IP address, for the failure log
        self.on_frame = on_frame
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self._unpacker = msgpack.Unpacker(raw=False, max_buffer_size=MAX_BUFFER_BYTES)
        self._packer = msgpack.Packer(use_bin_type=True)
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self.blocked = False  # the peer is not taking our data as fast as we send it
        self.on_blocked: Callable[[Link, bool], None] | None = None
        # Handshake state: None once the peer is verified (or without a secret, see below).
        self.role = role
        self._handshake = LinkHandshake(secret, node_id, role) if secret is not None else None
        self._failures = failures if failures is not None else FailureLog("link")
        self._verified = False  # the peer's frames go to on_frame
        self._may_send = False  # our frames are written
        self._failed = False  # counted as an authentication failure (once per connection)
        self._closing = False  # we closed it ourselves
        self._received = 0  # bytes received before the peer was verified
        self._timer: asyncio.TimerHandle | None = None
        self.ready: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    # --- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        peername = transport.get_extra_info("peername")
        if peername:
            self.address = str(peername[0])
        self._timer = asyncio.get_running_loop().call_later(
            HANDSHAKE_TIMEOUT_S, self._fail, "a link that did not complete the handshake in time"
        )
        if self._handshake is not None:
            self._write_now(self._handshake.hello())
        else:  # open plane: say who we are and send at once, as the peer does
            self._write_now([_HELLO, self.node_id])
            self._allow_sending()

    def pause_writing(self) -> None:
        self.blocked = True
        if self.on_blocked is not None:
            self.on_blocked(self, True)

    def resume_writing(self) -> None:
        self.blocked = False
        if self.on_blocked is not None:
            self.on_blocked(self, False)

    def data_received(self, data: bytes) -> None:
        self._unpacker.feed(data)
        try:
            if not self._verified:
                self._received += len(data)
                if not self._authenticate():
                    return
            for frame in self._unpacker:
                if self.peer_incarnation is None:
                    self._on_incarnation(frame)
                    continue
                if self._features_due:
                    self._features_due = False
                    if isinstance(frame, list) and len(frame) == 2 and frame[0] == _FEATURES:
                        self.peer_features = frozenset(map(str, frame[1]))
                        if self.on_features is not None:
                            self.on_features(self)
                        continue
                self.on_frame(self, frame)
        except AuthFailure as exc:
            self._fail(str(exc))
        except (ValueError, msgpack.UnpackException) as exc:
            if not self._verified:
                self._fail("a link with malformed handshake data")
                return
            log.warning("bad frame from %s: %s; closing the link", self.peer or "?", exc)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not (self._verified or self._failed or self._closing) and (
            self._received or (self._handshake is not None and self.role == INITIATOR)
        ):  # the peer hung up on our handshake (it has another secret, or none)
            self._failed = True
            self._failures(self.address, "a link closed by the peer during the handshake")
        self.transport = None
        self._may_send = False
        if self._timer is not None:
            self._timer.cancel()
        if not self.ready.done():
            self.ready.set_result(False)
        self.on_lost(self)

    # --- handshake ----------------------------------------------------------------------------
    def _authenticate(self) -> bool:
        """Consume handshake frames; True once the peer is verified (the frames after it are
        then still in the unpacker).  Raises AuthFailure on anything else."""
        for frame in self._unpacker:
            shake = self._handshake
            if shake is None:  # open plane: the first frame must name the peer
                if isinstance(frame, list) and len(frame) == 3 and frame[0] == _HELLO:
                    raise AuthFailure("a peer that uses a cluster secret (this node has none)")
                if not (isinstance(frame, list) and len(frame) == 2 and frame[0] == _HELLO):
                    raise AuthFailure("a frame before the hello")
                self.peer = str(frame[1])
            elif shake.peer_nonce is None:
                shake.on_hello(frame)
                self.peer = shake.peer
                if shake.role == INITIATOR:
                    self._write_now(shake.proof())
                continue
            else:
                shake.on_proof(frame)
                if shake.role == ACCEPTOR:  # only now: the initiator proved itself first
                    self._write_now(shake.proof())
                self._handshake = None
                self._allow_sending()
            self._verified = True
            if self._timer is not None:
                self._timer.cancel()
            return True
        if self._received > MAX_HANDSHAKE_BYTES:
            raise AuthFailure(f"a link handshake longer than {MAX_HANDSHAKE_BYTES} bytes")
        return False

    def _allow_sending(self) -> None:
        self._may_send = True
        self._write_now([_INCARNATION, self.incarnation])  # before any other frame of ours
        if self.features:
            self._write_now([_FEATURES, list(self.features)])
        if self._out:
            self.flush()

    def _on_incarnation(self, frame: Any) -> None:
        """The peer's first frame after the handshake: which process it is."""
        if not (isinstance(frame, list) and len(frame) == 2 and frame[0] == _INCARNATION):
            raise ValueError("a link whose first frame does not name the peer's incarnation")
        self.peer_incarnation = str(frame[1])
        if not self.ready.done():
            self.ready.set_result(True)

    def _write_now(self, frame: Any) -> None:
        if self.transport is not None:
            self.transport.write(self._packer.pack(frame))

    def _fail(self, reason: str) -> None:
        if self.transport is None or self._verified or self._failed:
            return
        self._failed = True
        self._failures(self.address, reason)
        self._out.clear()  # nothing of ours goes to a peer that did not prove itself
        self.transport.close()

    # --- sending ----------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self._may_send and self.transport is not None and not self.transport.is_closing()

    def send(self, frame: Any, by_reference: bool = False) -> None:
        """Queue ``frame`` for the next flush.  ``by_reference``: its long byte strings are
        written as they are (``encode_parts``): they must not change until then."""
        if by_reference:
            self._out += encode_parts(self._packer, frame)
        else:
            self._out.append(self._packer.pack(frame))
        if not self._flush_scheduled and self._may_send:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if not self._may_send:
            return
        out, self._out = self._out, []
        if out and self.transport is not None:
            # One system call for all (writev) without joining them first: what a loop
            # iteration forwards is often megabytes, and a buffer that size is fresh memory
            # each time (joined, a host-mode process took twice the page faults and about a
            # tenth more CPU per delivery).
            self.transport.writelines(out)

    def close(self) -> None:
        self._closing = True
        if self.transport is not None:
            self.flush()
            self.transport.close()


class _Peer:
    """The outbound side towards one node: a link when connected, a bounded backlog until."""

    def __init__(self, addr: Addr) -> None:
        self.addr = addr
        self.link: Link | None = None
        self.backlog: list[Any] = []
        self.backlog_weight = 0  # what the backlog's frames weigh (Links.send)
        self.connecting: asyncio.Task[None] | None = None
        self.incarnation: str | None = None  # the process the last link reached


class Links:
    """This broker's links: a listener for peers' connections and one connection per peer."""

    def __init__(
        self,
        node_id: str,
        on_frame: FrameHandler,
        *,
        host: str = "127.0.0.1",
        secret: ClusterSecret | None = None,
        features: tuple[str, ...] = (),
    ) -> None:
        check_bind(host, secret)
        self.node_id = node_id
        self.incarnation = secrets.token_hex(8)
        self.on_frame = on_frame
        self.host = host  # the address the listener binds
        self.secret = secret
        self.auth_failures = FailureLog("link")  # .count: connections rejected
        # Called when a link to a peer becomes blocked (True) or takes data again (False).
        self.on_blocked: Callable[[Link, bool], None] | None = None
        # Called with a peer's node id when frames sent to it will get no answer: the outbound
        # link to it was lost, or it restarted and what was queued for it was dropped.
        self.on_peer_lost: Callable[[str], None] | None = None
        # Called with a peer's node id when its outbound link is up, and again if the peer
        # names its features later: what ``supports`` answers for it may have changed.
        self.on_peer_ready: Callable[[str], None] | None = None
        self.features = features  # what this node's links say it takes (see the docstring)
        self._peers: dict[str, _Peer] = {}
        self._inbound: set[Link] = set()
        self._server: asyncio.base_events.Server | None = None
        self._closed = False

    async def start(self, port: int = 0) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accept, self.host, port, reuse_address=True)
        return self._server.sockets[0].getsockname()[1]

    def _link(self, on_lost: Callable[[Link], None], role: str) -> Link:
        return Link(
            self.node_id,
            self.on_frame,
            on_lost,
            role=role,
            secret=self.secret,
            failures=self.auth_failures,
            incarnation=self.incarnation,
            features=self.features,
        )

    def _accept(self) -> Link:
        link = self._link(self._inbound.discard, ACCEPTOR)
        self._inbound.add(link)
        return link

    async def stop(self) -> None:
        self._closed = True
        for peer in self._peers.values():
            if peer.connecting is not None:
                peer.connecting.cancel()
            if peer.link is not None:
                peer.link.close()
        for link in list(self._inbound):
            link.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def set_peer(self, node_id: str, addr: Addr) -> None:
        """Make ``node_id`` reachable at ``addr`` (a changed address reconnects)."""
        peer = self._peers.get(node_id)
        if peer is not None and peer.addr == addr:
            return
        self.remove_peer(node_id)
        self._peers[node_id] = _Peer(addr)

    def remove_peer(self, node_id: str) -> None:
        peer = self._peers.pop(node_id, None)
        if peer is None:
            return
        if peer.connecting is not None:
            peer.connecting.cancel()
        if peer.link is not None:
            peer.link.close()

    def incarnation_of(self, node_id: str) -> str | None:
        """The process of ``node_id`` our last link to it reached (None: none yet)."""
        peer = self._peers.get(node_id)
        return peer.incarnation if peer is not None else None

    def supports(self, node_id: str, feature: str) -> bool:
        """Whether the process our outbound link to ``node_id`` reaches takes ``feature``
        (False while no link is up: the backlog may reach a process on older code)."""
        peer = self._peers.get(node_id)
        return peer is not None and peer.link is not None and feature in peer.link.peer_features

    def blocked(self, node_id: str) -> bool:
        peer = self._peers.get(node_id)
        return peer is not None and peer.link is not None and peer.link.blocked

    def send(self, node_id: str, frame: Any, weight: int = 1, by_reference: bool = False) -> bool:
        """Queue ``frame`` for ``node_id``; False if the node is unknown or its backlog full.
        ``weight``: how many messages the frame carries, what it counts for in the backlog
        of a peer not connected yet; ``by_reference``: as ``Link.send``."""
        peer = self._peers.get(node_id)
        if peer is None:
            return False
        link = peer.link
        if link is not None and link.connected:
            link.send(frame, by_reference)
            return True
        if peer.backlog_weight + weight > MAX_PENDING_FRAMES:
            return False
        peer.backlog.append(frame)
        peer.backlog_weight += weight
        if peer.connecting is None and not self._closed:
            peer.connecting = asyncio.get_running_loop().create_task(self._connect(node_id, peer))
        return True

    async def _connect(self, node_id: str, peer: _Peer) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self._closed and self._peers.get(node_id) is peer:
                try:
                    _, link = await loop.create_connection(
                        lambda: self._link(partial(self._lost, node_id, peer), INITIATOR),
                        *peer.addr,
                    )
                except OSError as exc:
                    log.debug("link to %s at %s: %s", node_id, peer.addr, exc)
                    await asyncio.sleep(RECONNECT_DELAY_S)
                    continue
                try:
                    verified = await link.ready
                except asyncio.CancelledError:  # the peer was removed meanwhile
                    link.close()
                    raise
                if not verified:  # the handshake failed (logged and counted)
                    await asyncio.sleep(RETRY_AFTER_FAILURE_S)
                    continue
                link.on_blocked = self.on_blocked
                peer.link = link
                backlog, peer.backlog = peer.backlog, []
                peer.backlog_weight = 0
                restarted = peer.incarnation not in (None, link.peer_incarnation)
                peer.incarnation = link.peer_incarnation
                if restarted:  # what was queued was for the process that is gone
                    log.info("%s restarted: %d queued frames dropped", node_id, len(backlog))
                    if self.on_peer_lost is not None:
                        self.on_peer_lost(node_id)
                else:
                    for frame in backlog:
                        link.send(frame)
                self._ready(node_id, link)
                return
        finally:
            peer.connecting = None

    def _ready(self, node_id: str, link: Link) -> None:
        on_ready = self.on_peer_ready
        if on_ready is not None:
            link.on_features = lambda _: on_ready(node_id)  # the features came after the link
            on_ready(node_id)

    def _lost(self, node_id: str, peer: _Peer, link: Link) -> None:
        if peer.link is link:
            peer.link = None
            if self.on_peer_lost is not None and not self._closed:
                self.on_peer_lost(node_id)
        if link.blocked:
            link.blocked = False
            if self.on_blocked is not None:
                self.on_blocked(link, False)

    def any_blocked(self) -> bool:
        return any(p.link is not None and p.link.blocked for p in self._peers.values())


def encode_parts(packer: msgpack.Packer, frame: Any) -> list[bytes]:
    """``frame`` msgpack-encoded as ``packer.pack`` does (``use_bin_type``), in parts: each
    ``bytes`` value of at least ``BY_REFERENCE_BYTES`` is a part of its own, the value itself,
    after a part ending with its bin header.  Joined, the parts are ``packer.pack(frame)``;
    written with ``writelines`` (writev), a forwarded run of messages is not copied twice on
    its way to the socket (into the packer's buffer, then out of it)."""
    parts: list[bytes] = []
    head: list[bytes] = []

    def add(value: Any) -> None:
        cls = value.__class__
        if cls is list:
            head.append(packer.pack_array_header(len(value)))
            for item in value:
                add(item)
        elif cls is bytes and len(value) >= BY_REFERENCE_BYTES:
            head.append(_bin_header(len(value)))
            parts.append(b"".join(head))
            head.clear()
            parts.append(value)
        else:
            head.append(packer.pack(value))

    add(frame)
    if head:
        parts.append(b"".join(head))
    return parts


def _bin_header(size: int) -> bytes:
    """The msgpack bin header of ``size`` bytes (bin 8, 16 or 32, the smallest that fits)."""
    if size < 0x100:
        return b"\xc4" + size.to_bytes(1, "big")
    if size < 0x10000:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")


__all__ = ["Link", "Links", "encode_parts"]
