"""Inter-broker links (DESIGN.md §6): one persistent TCP connection per peer, framed, batched.

A frame is one msgpack value; msgpack's streaming unpacker does the framing, so no length
prefix is needed.  Frames sent during one event-loop iteration go out in one write: a broker
forwarding a burst of messages to a peer makes one system call, not one per message.

Either end of a connection may send on it.  A broker sends its own traffic on the connection
it opened to the peer (``Links.send``) and answers requests on the connection they came in on
(``Link.send``), so a reply never waits for a connection to be opened.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import msgpack

log = logging.getLogger(__name__)

Addr = tuple[str, int]
# Frames queued for a peer that is not (yet) connected; past this they are dropped: links
# carry Subscription traffic, which is at-most-once by definition (memory push).
MAX_PENDING_FRAMES = 100_000
RECONNECT_DELAY_S = 0.2
MAX_BUFFER_BYTES = 64 * 1024 * 1024
# Past this much unsent data the link says it is blocked (senders should slow down).
WRITE_HIGH_WATER = 1024 * 1024
_HELLO = "hello"

FrameHandler = Callable[["Link", Any], None]


class Link(asyncio.Protocol):
    """One framed connection; ``peer`` is the node id the other end said hello with."""

    def __init__(self, node_id: str, on_frame: FrameHandler, on_lost: Callable[[Link], None]):
        self.node_id = node_id
        self.peer = ""
        self.on_frame = on_frame
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self._unpacker = msgpack.Unpacker(raw=False, max_buffer_size=MAX_BUFFER_BYTES)
        self._packer = msgpack.Packer(use_bin_type=True)
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self.blocked = False  # the peer is not taking our data as fast as we send it
        self.on_blocked: Callable[[Link, bool], None] | None = None

    # --- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.send([_HELLO, self.node_id])

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
            for frame in self._unpacker:
                if isinstance(frame, list) and frame and frame[0] == _HELLO:
                    self.peer = str(frame[1])
                    continue
                self.on_frame(self, frame)
        except (ValueError, msgpack.UnpackException) as exc:
            log.warning("bad frame from %s: %s; closing the link", self.peer or "?", exc)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.on_lost(self)

    # --- sending ----------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def send(self, frame: Any) -> None:
        self._out.append(self._packer.pack(frame))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    def close(self) -> None:
        if self.transport is not None:
            self.flush()
            self.transport.close()


class _Peer:
    """The outbound side towards one node: a link when connected, a bounded backlog until."""

    def __init__(self, addr: Addr) -> None:
        self.addr = addr
        self.link: Link | None = None
        self.backlog: list[Any] = []
        self.connecting: asyncio.Task[None] | None = None


class Links:
    """This broker's links: a listener for peers' connections and one connection per peer."""

    def __init__(self, node_id: str, on_frame: FrameHandler) -> None:
        self.node_id = node_id
        self.on_frame = on_frame
        # Called when a link to a peer becomes blocked (True) or takes data again (False).
        self.on_blocked: Callable[[Link, bool], None] | None = None
        self._peers: dict[str, _Peer] = {}
        self._inbound: set[Link] = set()
        self._server: asyncio.base_events.Server | None = None
        self._closed = False

    async def start(self, host: str = "0.0.0.0", port: int = 0) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accept, host, port, reuse_address=True)
        return self._server.sockets[0].getsockname()[1]

    def _accept(self) -> Link:
        link = Link(self.node_id, self.on_frame, self._inbound.discard)
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

    def blocked(self, node_id: str) -> bool:
        peer = self._peers.get(node_id)
        return peer is not None and peer.link is not None and peer.link.blocked

    def send(self, node_id: str, frame: Any) -> bool:
        """Queue ``frame`` for ``node_id``; False if the node is unknown or its backlog full."""
        peer = self._peers.get(node_id)
        if peer is None:
            return False
        link = peer.link
        if link is not None and link.connected:
            link.send(frame)
            return True
        if len(peer.backlog) >= MAX_PENDING_FRAMES:
            return False
        peer.backlog.append(frame)
        if peer.connecting is None and not self._closed:
            peer.connecting = asyncio.get_running_loop().create_task(self._connect(node_id, peer))
        return True

    async def _connect(self, node_id: str, peer: _Peer) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self._closed and self._peers.get(node_id) is peer:
                try:
                    _, link = await loop.create_connection(
                        lambda: Link(self.node_id, self.on_frame, partial(self._lost, peer)),
                        *peer.addr,
                    )
                except OSError as exc:
                    log.debug("link to %s at %s: %s", node_id, peer.addr, exc)
                    await asyncio.sleep(RECONNECT_DELAY_S)
                    continue
                link.on_blocked = self.on_blocked
                peer.link = link
                backlog, peer.backlog = peer.backlog, []
                for frame in backlog:
                    link.send(frame)
                return
        finally:
            peer.connecting = None

    def _lost(self, peer: _Peer, link: Link) -> None:
        if peer.link is link:
            peer.link = None
        if link.blocked:
            link.blocked = False
            if self.on_blocked is not None:
                self.on_blocked(link, False)

    def any_blocked(self) -> bool:
        return any(p.link is not None and p.link.blocked for p in self._peers.values())


__all__ = ["Link", "Links"]
