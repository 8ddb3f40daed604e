"""One AMQP 0-9-1 connection: an asyncio Protocol (DESIGN.md §11 — every complete frame of a
read is handled in a loop, and everything written while doing so goes out in one write).

Negotiation: protocol header, Connection.Start / StartOk (PLAIN or AMQPLAIN against the
broker's users, checked off the event loop) / Tune / TuneOk / Open (the virtual host names
the namespace; a user may open only its own), heartbeats.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from pamqp import commands, decode

import flowmq_metrics as metrics
from flowmq_broker import lingering
from flowmq_broker.amqp.channel import Channel
from flowmq_broker.amqp.errors import AmqpError, ConnectionError_
from flowmq_broker.amqp.memqueue import MemoryQueue
from flowmq_broker.amqp.state import AmqpState
from flowmq_core.audit import audit_log
from flowmq_core.errors import NotFound
from flowmq_meta.catalog import DEFAULT_NAMESPACE
from flowmq_meta.users import RATE_LIMITED
from flowmq_wire.amqp import constants as rc
from flowmq_wire.amqp import frames as fr
from flowmq_wire.amqp.methods import UnknownMethod, decode_method, encode_method

log = logging.getLogger(__name__)

HEARTBEAT_S = 60
HANDSHAKE_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 1.0
# Publishes waiting to become durable, per connection: beyond it the connection stops
# reading, so a fast publisher cannot grow the broker's memory without bound.
MAX_PENDING_PUBLISHES = 20_000
WRITE_HIGH_WATER = 4 * 1024 * 1024
WRITE_LOW_WATER = 1024 * 1024

# AMQP clients send RabbitMQ's default account when given no credentials: anonymous, unless
# a user of that name exists (docs/security.md).
GUEST = "guest"

_START_OK = 0x000A000B
_CONNECTION_CLOSE = 0x000A0032
_CONNECTION_CLOSE_OK = 0x000A0033


class AmqpConnection(asyncio.Protocol):
    """Implements ``Link`` (link.py), the view its channels and the broker-wide state have."""

    def __init__(self, shared: AmqpState) -> None:
        self.shared = shared
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.limits = shared.limits  # frame_max, channel_max, ... (limits.py)
        self.reader = fr.FrameReader(self.limits.frame_max, whole_messages=True)
        # header, start, authenticating, tune, open, opening, opened, closing, closed
        self.state = "header"
        self.channels: dict[int, Channel] = {}
        self.frame_max = self.limits.frame_max
        self.channel_max = self.limits.channel_max
        # Body bytes received of messages not yet complete, on every channel (limits.py).
        self.partial_bytes = 0
        self.heartbeat = 0
        self.namespace = DEFAULT_NAMESPACE
        self.vhost = "/"
        self.username: str | None = None
        self.peer_username: str | None = None  # a client certificate's CN (tls_cert_as_username)
        self.user_namespace: str | None = None  # a user's: the only one it may open
        # What it may do (flowmq_core.acl); the namespace's view once Connection.Open is done.
        self.access = shared.services.authorizer.access(DEFAULT_NAMESPACE, None)
        self.peer = ""
        self.tasks: set[asyncio.Task[Any]] = set()
        # Memory queues this connection declared: exclusive ones go with it, auto-delete ones
        # too unless another connection still consumes them.
        self.owned_queues: list[MemoryQueue] = []
        self.paused_writing = False
        self._header = b""
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._in_read = False
        self._last_recv = self.loop.time()
        self._last_send = self._last_recv
        self._timer: asyncio.TimerHandle | None = None
        self._pending_publishes = 0
        self._reading_paused = False
        self.pressure = shared.services.pressure  # durable writes lagging (backpressure.py)
        self._counted = False

    # --- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self.shared.services.connection_limits.admit(self, transport):
            return  # closed at once, before the protocol header (max_connections, ...)
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(WRITE_HIGH_WATER, WRITE_LOW_WATER)  # type: ignore[attr-defined]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.shared.connections.add(self)
        tls = self.shared.tls
        # With tls_cert_as_username the certificate's CN is offered as the login (EXTERNAL).
        self.peer_username = tls.peer_username(transport) if tls is not None else None
        self._timer = self.loop.call_later(HANDSHAKE_TIMEOUT_S, self._handshake_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.shared.services.connection_limits.release(self)
        self.pressure.forget(self)
        self.state = "closed"
        self.transport = None
        if self._timer is not None:
            self._timer.cancel()
        for channel in list(self.channels.values()):
            channel.close()
        self.channels.clear()
        for q in self.owned_queues:
            if q.exclusive or not q.consumers:
                self.shared.cancel_consumers_of(q)
                self.shared.memqueues.delete(q)
        self.owned_queues.clear()
        for task in self.tasks:
            task.cancel()
        self.shared.connections.discard(self)
        if self._counted:
            metrics.amqp_connections.labels(self.namespace).dec()
            log.info(
                "AMQP connection %s (%s, vhost %s) closed%s",
                self.peer,
                self._who(),
                self.vhost,
                f": {exc}" if exc is not None else "",
            )

    def _who(self) -> str:
        return f"user {self.username!r}" if self.username is not None else "anonymous"

    def pause_writing(self) -> None:
        self.paused_writing = True
        for channel in self.channels.values():
            channel.set_paused(True)

    def resume_writing(self) -> None:
        self.paused_writing = False
        for channel in self.channels.values():
            channel.set_paused(False)

    def data_received(self, data: bytes) -> None:
        self._last_recv = self.loop.time()
        if self.state == "header":
            self._header += data
            if len(self._header) < 8:
                return
            header, data = self._header[:8], self._header[8:]
            self._header = b""
            if header != fr.PROTOCOL_HEADER:
                # Spec 4.2.2: answer with the protocol version we speak, then close.
                self._write(fr.PROTOCOL_HEADER)
                self._close_lingering()
                return
            self._start()
        if self.state == "closed":
            return
        try:
            frames = self.reader.feed(data)
        except fr.FrameError as exc:
            if isinstance(exc, fr.FrameTooLarge):
                metrics.limits_rejections_count.labels("amqp_frame_max").inc()
            self.fail(rc.FRAME_ERROR, f"FRAME_ERROR - {exc}", 0)
            self.flush()
            return
        self._in_read = True
        try:
            self._frames(frames)
        finally:
            self._in_read = False
        self.flush()

    def _frames(self, frames: list[fr.Frame]) -> None:
        """Handle a read's frames in order, consecutive publishes (or acks) of one open
        channel handed over together as a run (DESIGN.md §11)."""
        channels = self.channels
        run: list[Any] = []
        run_type = run_number = -1
        for frame_type, number, payload in frames:
            if frame_type == run_type and number == run_number:
                run.append(payload)
                continue
            if run:
                self._run(run_type, run_number, run)
                run = []
                run_type = run_number = -1
            if self.state == "closed":
                return
            if frame_type >= fr.FRAME_PUBLISH and self.state == "opened" and number in channels:
                run_type, run_number, run = frame_type, number, [payload]
                continue
            self._frame(frame_type, number, payload)
        if run and self.state != "closed":
            self._run(run_type, run_number, run)

    def _run(self, frame_type: int, number: int, run: list[Any]) -> None:
        channel = self.channels.get(number)
        if channel is None:  # closed by a frame of this read: what the generic path says
            for payload in run:
                self._frame(frame_type, number, payload)
            return
        channel.handle_run(frame_type, run)

    # --- output -------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self._out.append(data)
        if not self._in_read and not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if not self._out:
            return
        data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
        self._out.clear()
        self._write(data)

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
            self._last_send = self.loop.time()

    def _close_transport(self) -> None:
        self.flush()
        if self.transport is not None:
            self.transport.close()

    def _close_lingering(self) -> None:
        """Close after a refusal the client may not have read yet (a Connection.Close left
        unanswered, a protocol header), draining what it still sends (flowmq_broker.lingering)."""
        self.flush()
        # The socket lingers on, but this connection writes nothing more to it.
        transport, self.transport = self.transport, None
        lingering.close(transport, self)

    # --- frames -------------------------------------------------------------------------

    def _frame(self, frame_type: int, number: int, payload: bytes) -> None:
        if frame_type == fr.FRAME_HEARTBEAT:
            if number != 0:
                self.fail(rc.FRAME_ERROR, "heartbeat frame on a non-zero channel", 0)
            return
        if self.state == "closing":
            if number == 0 and frame_type == fr.FRAME_METHOD and len(payload) >= 4:
                index = fr.method_index(payload)
                if index == _CONNECTION_CLOSE:
                    self.send(encode_method(0, commands.Connection.CloseOk()))
                    self._close_transport()
                elif index == _CONNECTION_CLOSE_OK:
                    self._close_transport()
            return
        try:
            if number == 0:
                if frame_type != fr.FRAME_METHOD:
                    raise ConnectionError_(rc.UNEXPECTED_FRAME, "content frame on channel 0")
                self._connection_method(decode_method(payload))
                return
            if self.state != "opened":
                raise ConnectionError_(
                    rc.CHANNEL_ERROR, f"frame on channel {number} before Connection.Open"
                )
            channel = self.channels.get(number)
            if channel is None:
                self._open_channel(number, frame_type, payload)
                return
            channel.handle_frame(frame_type, payload)
        except AmqpError as exc:
            self.fail(exc.code, exc.text, _index(payload, frame_type))
        except UnknownMethod as exc:
            self.fail(rc.NOT_IMPLEMENTED, f"NOT_IMPLEMENTED - {exc}", _index(payload, frame_type))
        except fr.SyntaxError_ as exc:
            self.fail(rc.SYNTAX_ERROR, f"SYNTAX_ERROR - {exc}", _index(payload, frame_type))

    def _open_channel(self, number: int, frame_type: int, payload: Any) -> None:
        if frame_type >= fr.FRAME_PUBLISH:  # a publish or ack the reader recognised
            name = "Basic.Publish" if frame_type == fr.FRAME_PUBLISH else "Basic.Ack"
            raise ConnectionError_(
                rc.CHANNEL_ERROR, f"expected Channel.Open on channel {number}, got {name}"
            )
        if frame_type != fr.FRAME_METHOD:
            raise ConnectionError_(rc.CHANNEL_ERROR, f"frame on unopened channel {number}")
        method = decode_method(payload)
        if not isinstance(method, commands.Channel.Open):
            raise ConnectionError_(
                rc.CHANNEL_ERROR, f"expected Channel.Open on channel {number}, got {method.name}"
            )
        if number > self.channel_max:
            metrics.limits_rejections_count.labels("amqp_channel_max").inc()
            raise ConnectionError_(
                rc.CHANNEL_ERROR, f"channel {number} is above channel_max {self.channel_max}"
            )
        self.channels[number] = Channel(self, self.shared, number)
        self.send(encode_method(number, commands.Channel.OpenOk()))

    def channel_closed(self, number: int, channel: object) -> None:
        if self.channels.get(number) is channel:
            del self.channels[number]

    def cancel_consumers(self, match: Callable[[Any], bool]) -> None:
        for channel in list(self.channels.values()):
            channel.cancel_consumers(match)

    def fail(self, code: int, text: str, method: int) -> None:
        """Close the connection for a hard error: Connection.Close, then wait for CloseOk."""
        if self.state in ("closing", "closed"):
            return
        log.info("AMQP connection %s closed: %s", self.peer, text)
        self.state = "closing"
        for channel in list(self.channels.values()):
            channel.close()
        self.send(
            encode_method(
                0, commands.Connection.Close(code, text[:255], method >> 16, method & 0xFFFF)
            )
        )
        self._set_timer(CLOSE_TIMEOUT_S, self._close_lingering)

    def shutdown(self) -> None:
        """Broker stopping: tell the client (320 CONNECTION_FORCED)."""
        if self.state == "opened":
            self.fail(rc.CONNECTION_FORCED, "CONNECTION_FORCED - broker shutting down", 0)
            self.flush()
        else:
            self._close_transport()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # --- negotiation --------------------------------------------------------------------

    def _start(self) -> None:
        self.state = "start"
        self.send(
            encode_method(
                0,
                commands.Connection.Start(
                    version_major=0,
                    version_minor=9,
                    server_properties={
                        "product": "FlowMQ-py",
                        "version": "0.1.0",
                        "platform": "Python",
                        "capabilities": {
                            "publisher_confirms": True,
                            "basic.nack": True,
                            "consumer_cancel_notify": True,
                            "exchange_exchange_bindings": False,
                            "connection.blocked": False,
                            "authentication_failure_close": True,
                            "per_consumer_qos": True,
                        },
                    },
                    mechanisms="PLAIN AMQPLAIN"
                    + (" EXTERNAL" if self.peer_username is not None else ""),
                    locales="en_US",
                ),
            )
        )

    def _connection_method(self, m: Any) -> None:
        state = self.state
        if isinstance(m, commands.Connection.StartOk) and state == "start":
            self._start_ok(m)
        elif isinstance(m, commands.Connection.TuneOk) and state == "tune":
            self._tune_ok(m)
        elif isinstance(m, commands.Connection.Open) and state == "open":
            self.state = "opening"
            task = self.loop.create_task(self._open(m))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        elif isinstance(m, commands.Connection.Close):
            self.send(encode_method(0, commands.Connection.CloseOk()))
            self.state = "closed"
            self._close_transport()
        elif isinstance(m, commands.Connection.CloseOk):
            self._close_transport()
        elif isinstance(m, commands.Connection.Blocked | commands.Connection.Unblocked):
            pass
        else:
            raise ConnectionError_(
                rc.COMMAND_INVALID, f"{m.name} is not valid now (connection state {state})"
            )

    def _start_ok(self, m: commands.Connection.StartOk) -> None:
        """An anonymous login is answered at once; a user's is checked off the event loop
        (``_authenticate``) while the connection waits in state ``authenticating``; EXTERNAL
        takes the user the client certificate names."""
        if m.mechanism == "EXTERNAL":
            self._external_login()
            return
        user, password = _credentials(m.mechanism, m.response)
        users = self.shared.services.users
        if user is None or (
            user == GUEST and password == GUEST.encode() and users.namespace_of(GUEST) is None
        ):
            if not self.shared.allow_anonymous:
                self._refuse_login(m.mechanism, user, "anonymous clients are not allowed")
                return
            self._tune()
            return
        self.state = "authenticating"
        task = self.loop.create_task(self._authenticate(m.mechanism, user, password))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _authenticate(self, mechanism: str, user: str, password: bytes | None) -> None:
        address = self.peer.rpartition(":")[0] or self.peer
        try:
            result = await self.shared.services.users.authenticate(user, password, address)
        except Exception:
            log.exception("AMQP connection %s: checking the login of %r failed", self.peer, user)
            result = None
        if self.state != "authenticating":
            return
        if result is None:
            self._refuse_login(mechanism, user, "the login could not be checked")
        elif not result:
            why = result.reason
            if result.reason == RATE_LIMITED:
                why = f"{RATE_LIMITED}: retry in {result.retry_after:.0f} s"
            self._refuse_login(mechanism, user, why)
        else:
            self.username = user
            self.user_namespace = result.namespace
            self._tune()
        self.flush()

    def _external_login(self) -> None:
        user = self.peer_username
        namespace = None if user is None else self.shared.services.users.namespace_of(user)
        if namespace is None:
            why = (
                "no client certificate names a user"
                if user is None
                else "certificate names no user"
            )
            self._refuse_login("EXTERNAL", user, why)
            return
        self.username = user
        self.user_namespace = namespace
        self._tune()

    def _refuse_login(self, mechanism: str, user: str | None, why: str) -> None:
        """403 ACCESS_REFUSED (Connection.Close), the client told as little as RabbitMQ does."""
        audit_log.info("AMQP connection %s: login refused (%s); user name %r", self.peer, why, user)
        self.fail(
            rc.ACCESS_REFUSED,
            f"ACCESS_REFUSED - login refused using authentication mechanism {mechanism}",
            _START_OK,
        )

    def _tune(self) -> None:
        self.state = "tune"
        limits = self.limits
        self.send(
            encode_method(
                0, commands.Connection.Tune(limits.channel_max, limits.frame_max, HEARTBEAT_S)
            )
        )

    def _tune_ok(self, m: commands.Connection.TuneOk) -> None:
        if m.frame_max and m.frame_max < fr.FRAME_MIN_SIZE:
            raise ConnectionError_(rc.SYNTAX_ERROR, f"frame_max {m.frame_max} is below 4096")
        limits = self.limits
        self.frame_max = min(m.frame_max or limits.frame_max, limits.frame_max)
        self.reader.max_frame_size = self.frame_max  # what was agreed, from now on
        self.channel_max = min(m.channel_max or limits.channel_max, limits.channel_max)
        self.heartbeat = m.heartbeat
        self.state = "open"
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.heartbeat:
            self._set_timer(self.heartbeat / 2, self._beat)
        else:
            self._set_timer(HANDSHAKE_TIMEOUT_S, self._handshake_timeout)

    async def _open(self, m: commands.Connection.Open) -> None:
        vhost = m.virtual_host or "/"
        namespace = DEFAULT_NAMESPACE if vhost in ("/", DEFAULT_NAMESPACE) else vhost.lstrip("/")
        own = self.user_namespace
        if own is not None and namespace != own:
            if vhost != "/":  # a user's "/" is its own namespace; any other must be it
                audit_log.info(
                    "AMQP connection %s: user %r refused vhost %s (its namespace is %s)",
                    self.peer,
                    self.username,
                    vhost,
                    own,
                )
                self.fail(
                    rc.NOT_ALLOWED,
                    f"NOT_ALLOWED - vhost {vhost} is not user {self.username}'s ({own})",
                    m.index,
                )
                self.flush()
                return
            namespace = own
        try:
            await self.shared.catalog.get_namespace(namespace)
        except (NotFound, ValueError):
            self.fail(rc.NOT_ALLOWED, f"NOT_ALLOWED - vhost {vhost} not found", m.index)
            self.flush()
            return
        if self.state != "opening":
            return
        access = self.shared.services.authorizer.access(namespace, self.username)
        if not access.may_access():
            who = self.username if self.username is not None else "anonymous"
            self.fail(
                rc.ACCESS_REFUSED,
                f"ACCESS_REFUSED - access to vhost '{vhost}' refused for user '{who}'",
                m.index,
            )
            self.flush()
            return
        self.access = access
        self.vhost = vhost
        self.namespace = namespace
        self.state = "opened"
        self._counted = True
        metrics.amqp_connections.labels(namespace).inc()
        log.info("AMQP connection %s: %s opened vhost %s", self.peer, self._who(), vhost)
        self.send(encode_method(0, commands.Connection.OpenOk()))
        self.flush()

    # --- timers ---------------------------------------------------------------------------

    def _set_timer(self, delay: float, fn: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(delay, fn)

    def _handshake_timeout(self) -> None:
        if self.state not in ("opened", "closed"):
            log.info("AMQP connection %s: handshake timed out", self.peer)
            self._close_transport()

    def _beat(self) -> None:
        """Send a heartbeat when idle; give up on a peer silent for two intervals."""
        if self.state == "closed":
            return
        now = self.loop.time()
        if now - self._last_recv > 2 * self.heartbeat:
            log.info("AMQP connection %s: missed heartbeats", self.peer)
            self.state = "closed"
            if self.transport is not None:
                self.transport.abort()
            return
        if now - self._last_send >= self.heartbeat / 2:
            self._write(fr.HEARTBEAT_FRAME)
        self._set_timer(self.heartbeat / 2, self._beat)

    # --- publish flow control ---------------------------------------------------------------

    def publish_started(self, n: int) -> None:
        self._pending_publishes += n
        if self._pending_publishes > MAX_PENDING_PUBLISHES and not self._reading_paused:
            self._reading_paused = True
            if self.transport is not None and not self.pressure.holds(self):
                self.transport.pause_reading()
        # Durable writes lag: read nothing more from this publisher until they catch up.
        if (
            self.pressure.active
            and self.transport is not None
            and self.pressure.hold(self, self._pressure_over)
            and not self._reading_paused
        ):
            self.transport.pause_reading()

    def publish_finished(self, n: int) -> None:
        self._pending_publishes -= n
        if self._reading_paused and self._pending_publishes < MAX_PENDING_PUBLISHES // 2:
            self._reading_paused = False
            if not self.pressure.holds(self):
                self._resume_reading()

    def _pressure_over(self) -> None:
        if not self._reading_paused:
            self._resume_reading()

    def _resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()


def _index(payload: Any, frame_type: int) -> int:
    if frame_type == fr.FRAME_METHOD and len(payload) >= 4:
        return fr.method_index(payload)
    return fr.PSEUDO_METHODS.get(frame_type, 0)


def _credentials(mechanism: str, response: Any) -> tuple[str | None, bytes | None]:
    raw = response.encode() if isinstance(response, str) else bytes(response or b"")
    if mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) != 3:
            raise ConnectionError_(rc.ACCESS_REFUSED, "malformed PLAIN response")
        return parts[1].decode("utf-8", "replace") or None, parts[2]
    if mechanism == "AMQPLAIN":
        try:
            table = decode.field_table(len(raw).to_bytes(4, "big") + raw)[1]
        except Exception:
            raise ConnectionError_(rc.ACCESS_REFUSED, "malformed AMQPLAIN response") from None
        login = table.get("LOGIN")
        password = table.get("PASSWORD")
        if isinstance(password, str):
            password = password.encode()
        elif not isinstance(password, bytes):
            password = None
        return (str(login) if login else None), password
    raise ConnectionError_(rc.ACCESS_REFUSED, f"unsupported mechanism {mechanism!r}")
